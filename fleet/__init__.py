"""The fleet: serve instances behind one or more routers (docs/fleet.md)."""

"""Tamper evidence for the audit log: every row carries a SHA-256 chained over its predecessor's hash and its own
content, and the database refuses to change rows.

`row_hash = sha256(previous_hash + canonical JSON of the row's content)`, the first row chained to GENESIS. Rows are
chained in id order (the order they were written); `AuditEvent.save` takes the chain head under a row lock, so two
writers never chain to the same predecessor. `verify_chain` walks the table and names the first row whose content no
longer matches its hash, or whose link no longer meets its predecessor (a row removed or inserted before it); the
head also keeps the newest hash, so removing the newest rows shows too.

Retention (pantheon_site/audit_retention.py) may remove the oldest rows, and only a prefix of the chain: the
`audit_pruned` event it writes records the removed prefix's last hash as an anchor (`details["anchor_hash"]`), and
`verify_chain` accepts a first remaining row linked to a recorded anchor where it would otherwise demand GENESIS.
Any other removal still breaks a link: a row taken from the middle, or the first row after a prune (its successor
links to a hash no prune recorded).

The trigger makes the table append-only below the ORM: on PostgreSQL it refuses UPDATE and DELETE, so even raw SQL
cannot rewrite history quietly without first dropping it (which needs the table owner's rights); the one DELETE it
lets through is retention's, of rows up to the id named by the transaction-local setting `PRUNE_SETTING`, which the
prune sets in its own transaction (a stray DELETE has none; the setting needs no privilege, so it guards against
mistakes, and the chain against the rest). On SQLite it refuses UPDATE only, since Django empties SQLite tables with
DELETE between tests. TRUNCATE (Django's flush on PostgreSQL) is left to the database's privileges: it leaves an
empty log, which verifies but cannot pass for the old one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC

GENESIS = "0" * 64
TABLE = "pantheon_site_auditevent"
TRIGGER = "pantheon_audit_append_only"
PRUNE_SETTING = "pantheon.audit_prune_through"

# The columns a row's hash covers: all of them but the id and the two hashes.
CONTENT_FIELDS = (
    "occurred_at",
    "operation",
    "outcome",
    "error_type",
    "reason",
    "actor_kind",
    "actor_label",
    "model",
    "request_id",
    "client_address",
    "duration_ms",
    "details",
)


def chain_hash(previous_hash: str, event) -> str:
    """The hash of `event` (any object with the content fields) chained to `previous_hash`."""
    content = {name: getattr(event, name) for name in CONTENT_FIELDS}
    content["occurred_at"] = event.occurred_at.astimezone(UTC).isoformat(timespec="microseconds")
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256((previous_hash + canonical).encode()).hexdigest()


@dataclass(frozen=True)
class ChainReport:
    """What `verify_chain` found: how many rows it checked, and the first broken one (None when the chain holds)."""

    checked: int
    broken_id: int | None = None
    problem: str = ""
    anchor: str = ""  # the prune anchor the remaining chain starts from; empty: it starts at GENESIS

    @property
    def intact(self) -> bool:
        return self.broken_id is None and not self.problem

    def describe(self) -> str:
        if self.intact and self.anchor:
            return (
                f"audit chain intact: {self.checked} events verified "
                f"(older events were pruned by retention; the chain starts at anchor {self.anchor[:12]}…)"
            )
        if self.intact:
            return f"audit chain intact: {self.checked} events verified"
        if self.broken_id is None:
            return f"audit chain broken after {self.checked} events: {self.problem}"
        return f"audit chain broken at event {self.broken_id}: {self.problem}"


def verify_chain(events, head_hash: str | None, anchors: frozenset[str] = frozenset()) -> ChainReport:
    """Walk `events` (AuditEvents in id order) and report the first broken link. `head_hash` is the hash the chain
    head holds (None when there is no head yet). `anchors` are the hashes prune events recorded: the first event
    may link to one of them instead of GENESIS (the rows before it were pruned by retention)."""
    previous = GENESIS
    anchor = ""
    checked = 0
    for event in events:
        if checked == 0 and event.previous_hash != GENESIS and event.previous_hash in anchors:
            previous = anchor = event.previous_hash
        if event.previous_hash != previous:
            problem = "its link does not meet the row before (a row was removed or put in)"
            return ChainReport(checked, event.id, problem, anchor)
        if chain_hash(previous, event) != event.row_hash:
            return ChainReport(checked, event.id, "its content does not match its hash (the row was altered)", anchor)
        previous = event.row_hash
        checked += 1
    if head_hash is not None and head_hash != previous:
        return ChainReport(checked, None, "the newest events were removed (the chain head names a later hash)", anchor)
    return ChainReport(checked, anchor=anchor)


def install_trigger(connection, *, prunable: bool = True) -> None:
    """Create the append-only trigger on this connection's database (idempotent). `prunable`: on PostgreSQL, let
    through a DELETE of rows up to the id `PRUNE_SETTING` names in the current transaction (retention's); without
    it (the trigger before retention existed) every DELETE is refused."""
    prune_gate = (
        f"""
                    IF TG_OP = 'DELETE' AND OLD.id <= COALESCE(
                        NULLIF(current_setting('{PRUNE_SETTING}', true), '')::bigint, 0) THEN
                        RETURN OLD;
                    END IF;"""
        if prunable
        else ""
    )
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"""
                CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN{prune_gate}
                    RAISE EXCEPTION 'audit events are append-only: % refused', TG_OP;
                END $$;
                """
            )
            cursor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE}")
            cursor.execute(
                f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE OR DELETE ON {TABLE} FOR EACH ROW EXECUTE FUNCTION {TRIGGER}()"
            )
        elif connection.vendor == "sqlite":
            cursor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER}")
            cursor.execute(
                f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE ON {TABLE} "
                "BEGIN SELECT RAISE(ABORT, 'audit events are append-only: UPDATE refused'); END"
            )


def remove_trigger(connection) -> None:
    """Drop the trigger (the migration's reverse, and a test that alters a row on purpose)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE}")
        elif connection.vendor == "sqlite":
            cursor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER}")

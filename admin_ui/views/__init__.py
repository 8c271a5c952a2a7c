"""The UI's views, one module per page; each calls the same service functions the API does."""

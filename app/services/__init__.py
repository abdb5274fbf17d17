"""Services: one module per resource; each operation owns its transaction.

An endpoint parses the request, calls one service function, and serializes what it returns.
The service function decides authorization, runs idempotency, and opens the transaction
itself (``async with db.transaction() as conn``) around the ledger calls, so the COMMIT has
happened — or failed and raised — before the function returns. Nothing commits after the
answer: no request-scoped dependency holds a connection or a transaction.

    request -> api/<resource>.py (parse) -> services/<resource>.py (authorize, transaction)
            -> ledger/<noun>.py (SQL) -> COMMIT -> api serializes -> response
"""

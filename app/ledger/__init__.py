"""The ledger: every SQL statement Berth runs lives in this package.

Functions are named noun-first (``ledger_reserve_many``, ``task_claim_batch``) and take the
session or connection first and keyword-only arguments after it. "Now" is passed in, which
makes expiry testable without sleeping.
"""

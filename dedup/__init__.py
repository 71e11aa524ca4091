"""The dedup protocol: keys, the run ledger and the outcomes it returns.

Nothing in this package knows about Flask or HTTP; handlers adapt it.
"""

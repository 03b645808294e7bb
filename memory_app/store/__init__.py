"""Layer 3, the stores: everything written or read for one session, keyed by its id.

``log`` (messages and their cursors), ``snapshots`` (compare-and-swap summaries), ``sessions``
(the session row: fields, counters, its lock), ``transfer`` (export and import). Each checks
its input with the rule book (``memory_app.validation``) before it writes.
"""

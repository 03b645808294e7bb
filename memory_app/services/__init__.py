"""Layer 4, the services: what is built from the stores.

``context`` (window rules, pure) and ``windows`` (reading one), ``recall`` (search and recalled
context), ``embedding`` (vectors and their indexes), ``compaction`` (summaries), ``background``
(the one way to schedule summaries and embedding), ``owners`` (one owner's export and erase),
``retention`` (policies and the sweeps), ``fusion`` (fusing rankings: pure functions).
"""

"""Expiry, quotas, compiler retention and pins: what leaves the cache, and when.

``plan`` decides (pure functions over entry stats), ``pins`` says what must stay,
``evictor`` applies a plan and collects unreferenced blobs, ``maintenance`` runs it in
the background on one replica at a time.
"""

"""The index's durable copy in the blob store, and rebuilding the index from it.

The blob store is the source of truth (docs/operations.md): every entry, alias, token,
namespace policy and pin the index holds is also a document beside the blobs
(``documents.py`` says how each is written), kept in step by a wrapper around the index
(``durable.py``). ``reindex.py`` rebuilds a lost or wiped index from them;
``fsck.py`` compares index, documents and blobs and repairs what disagrees.
"""

"""The metadata store: every piece of state kept in Redis, its keys and its stored formats.

``metadata_store.keys`` is the one table of key families; each family is read and written by
one repository of this package. Nothing outside it builds a Redis key.
"""

"""Canal's parser role: the binlog stream, the reader, row decoding and position finding.

- ``binlog_stream``: mysql-replication opened correctly for MariaDB (GTID dump length
  fixed, silent reconnect off), binlog variables checked.
- ``reader``: ``BinlogReader``, a dump connection turned into entries, with its own
  reconnect and a switch to the standby; ``transaction`` assembles the entries of a
  transaction.
- ``rows``: the one entry point for row decoding (``RowsDecoder``); ``rowcodec`` and
  ``_rowcodec`` (C) are the per-table decoders; ``decoding`` is the reference decoder
  (a leaf: it imports nothing of the parser).
- ``finder`` + ``binlog_search``: ``PositionFinder`` (Canal's findStartPosition);
  ``logposition``: the log position managers it reads history from.
"""

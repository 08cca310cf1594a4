"""The chaos suite: failures under a write load, each run ending with one checker.

Pieces:

* ``load.py``: ``LoadWriter``, transactions of inserts/updates/deletes over
  ``{tag}_a.items`` and ``{tag}_b.orders`` (key ``k``, per-key version ``v``); its
  history is exact (GTID per commit; uncertain commits and commits a database failover
  lost are settled against the rows after reconnecting).
* ``consumer.py``: a consumer process (ClusterConnector, exclusive per client id) that
  logs every batch (id, epoch, leader URL, row changes) before acking it, and each ack.
* ``checker.py``: every committed change delivered, per-key order, duplicates
  attributed to unacked batches or acks within a window before a fault, no epoch
  served by two nodes, failover stall. One line printed, JSON in ``results/``.
* ``harness.py``: ``ChaosRun`` (nodes from ``node_fixtures``, load, consumers, a
  /v1/health poller, faults, the final check); ``conftest.py``: the ``chaos_run``
  fixture and the ``chaos`` marker.

Commands::

    .venv/bin/pytest tests/chaos                      # every scenario (also in make test)
    .venv/bin/python tests/chaos/run_all.py           # every scenario + a summary table
    .venv/bin/python tests/chaos/nemesis.py --minutes 10 --seed 7   # random faults
"""

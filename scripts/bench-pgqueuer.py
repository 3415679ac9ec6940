#!/usr/bin/env python3
"""make bench's generic-queue reference: PgQueuer (PyPI `pgqueuer`) on the benchmark's own cluster.
Run with the interpreter of .build/bench-venv (scripts/bench-venv makes it); scripts/bench.py drives it:

  bench-pgqueuer.py install DSN          PgQueuer's tables, triggers and functions (its own installer)
  bench-pgqueuer.py enqueue DSN COUNT    COUNT no-op jobs, enqueued in batches of 10,000 with PgQueuer's API
  bench-pgqueuer.py drain DSN BATCH      one consumer process: dequeues BATCH jobs at a time, runs a no-op
                                         for each, exits when the queue is empty (PgQueuer's drain mode)

Each job is a no-op (`async def noop(job): pass`): what is measured is PgQueuer's own cost of claiming a
job, marking it done (its status log) and deleting it.
"""

import asyncio
import sys
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.domain.types import QueueExecutionMode

ENTRYPOINT = "noop"


async def install(dsn):
    connection = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def enqueue(dsn, count):
    connection = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        for start in range(0, count, 10000):
            n = min(10000, count - start)
            await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
    finally:
        await connection.close()


async def drain(dsn, batch_size):
    connection = await asyncpg.connect(dsn)
    try:
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint(ENTRYPOINT)
        async def noop(job):
            pass

        # Its log aggregation off: the log's rows are what the benchmark reads the drain's span from.
        await manager.run(batch_size=batch_size, mode=QueueExecutionMode.drain,
                          dequeue_timeout=timedelta(seconds=1), log_aggregation_interval=timedelta(0))
    finally:
        await connection.close()


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    command, dsn = sys.argv[1], sys.argv[2]
    if command == "install":
        asyncio.run(install(dsn))
    elif command == "enqueue":
        asyncio.run(enqueue(dsn, int(sys.argv[3])))
    elif command == "drain":
        asyncio.run(drain(dsn, int(sys.argv[3])))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

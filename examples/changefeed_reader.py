#!/usr/bin/env python3
"""A reference changefeed reader: applies siwa.changefeed to the app's own database, each change once.

    export SIWA_DATABASE_URL=postgresql://app_reader@siwa-db/siwa  # a member of siwa_app
    export APP_DATABASE_URL=postgresql://app@app-db/app             # the app's own database
    python3 changefeed_reader.py

- The cursor (the last position applied) lives in the app's database, in the table
  changefeed_cursor, and moves in the same transaction as the effects of the changes it covers: after
  a crash the reader resumes exactly where the app's state is.
- It waits on LISTEN siwa_changes (a wake-up when changes commit) and on a timer (--poll-interval):
  a NOTIFY lost while it was disconnected, or never delivered, is caught by the next tick.
- When either database goes away it reconnects, backing off up to 30 s, and reads on from the cursor.
- Positions have no gaps (1, 2, 3, … in commit order) and only retention (siwa.settings.
  changes_retention, 7 days by default) deletes rows. So when the next row is not cursor + 1, changes
  were pruned while the reader was away: it applies what came before the gap, then stops with exit
  status 3 and says so. Resynchronise the app from siwa's current state (docs/sql.md, "Detecting
  that you were away too long"), then set changefeed_cursor.position and start it again.

Needs `pip install psycopg[binary]`. Stop it with SIGINT or SIGTERM.
"""
import argparse
import os
import signal
import sys
import time

import psycopg

import app

CURSOR_SCHEMA = """
CREATE TABLE IF NOT EXISTS changefeed_cursor (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    position  bigint  NOT NULL                 -- the last position applied (0: none yet)
);
INSERT INTO changefeed_cursor (position) VALUES (0) ON CONFLICT DO NOTHING;
"""

# The columns a webhook's data carries, from the view the role siwa_app may read.
READ = """
SELECT position, id, type, sub, event_time, applied_at, jti, audience, sessions_revoked,
       refresh_tokens_revoked, email, is_private_email, old_sub
  FROM siwa.changefeed
 WHERE position > %s
 ORDER BY position
 LIMIT %s
"""
COLUMNS = ("position", "change_id", "type", "sub", "event_time", "applied_at", "jti", "audience",
           "sessions_revoked", "refresh_tokens_revoked", "email", "is_private_email", "old_sub")

GAP_EXIT = 3


class Gap(Exception):
    """Changes between the cursor and the next row were pruned: never skip them silently."""


def log(*words):
    print("changefeed_reader:", *words, file=sys.stderr, flush=True)


def apply_batch(feed, appdb, batch_size: int) -> int:
    """Applies the next batch after the stored cursor in one transaction of the app's database;
    returns how many changes it applied. Raises Gap once the changes before the gap are committed."""
    with appdb.transaction():
        # FOR UPDATE: a second reader started by mistake waits here instead of applying twice.
        cursor = appdb.execute("SELECT position FROM changefeed_cursor FOR UPDATE").fetchone()[0]
        rows = feed.execute(READ, (cursor, batch_size)).fetchall()
        applied = 0
        for row in rows:
            change = dict(zip(COLUMNS, row))
            if change["position"] != cursor + 1:
                gap = Gap(f"the changefeed's next change is position {change['position']}, but the app's "
                          f"cursor is {cursor}: positions {cursor + 1} to {change['position'] - 1} were "
                          f"pruned (siwa.settings.changes_retention) before this reader applied them")
                break
            app.apply_change(appdb, change["type"], change)
            cursor = change["position"]
            applied += 1
        else:
            gap = None
        appdb.execute("UPDATE changefeed_cursor SET position = %s", (cursor,))
    # Committed: the effects and the cursor together.
    if gap:
        raise gap
    return applied


def run(siwa_url: str, app_url: str, poll_interval: float, batch_size: int) -> None:
    """Reads forever: until a gap (Gap) or a signal (KeyboardInterrupt)."""
    backoff = 1.0
    while True:
        try:
            # autocommit on the feed: each SELECT is a snapshot of its own, and LISTEN takes effect now.
            with psycopg.connect(siwa_url, autocommit=True) as feed, psycopg.connect(app_url) as appdb:
                app.create_schema(appdb)
                with appdb.transaction():
                    appdb.execute(CURSOR_SCHEMA)
                feed.execute("LISTEN siwa_changes")  # before the first read: no wake-up falls between
                log("connected; reading from the stored cursor")
                backoff = 1.0
                while True:
                    while apply_batch(feed, appdb, batch_size) == batch_size:
                        pass  # more may be waiting: read on at once
                    # Wait for a NOTIFY (its payload, the last position, is only a hint) or the timer.
                    for _ in feed.notifies(timeout=poll_interval, stop_after=1):
                        pass
        except psycopg.OperationalError as error:
            log(f"database unavailable ({type(error).__name__}); reconnecting in {backoff:.0f} s")
            time.sleep(backoff)
            backoff = min(backoff * 2, 30.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poll-interval", type=float, default=5.0,
                        help="seconds between reads when no NOTIFY arrives (default 5)")
    parser.add_argument("--batch-size", type=int, default=100)
    arguments = parser.parse_args()
    # SIGTERM (a service manager's stop) like Ctrl-C: an interrupted transaction rolls back, and what
    # committed stays committed, cursor and effects together.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run(os.environ["SIWA_DATABASE_URL"], os.environ["APP_DATABASE_URL"], arguments.poll_interval,
            arguments.batch_size)
    except Gap as gap:
        log(f"stopped: {gap}. Resynchronise the app from siwa's current state, set "
            f"changefeed_cursor.position, then start again.")
        sys.exit(GAP_EXIT)
    except KeyboardInterrupt:
        log("stopped")


if __name__ == "__main__":
    main()

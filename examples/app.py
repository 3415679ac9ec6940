"""The app's side of both reference consumers: its own tables and what it does with each change.

A stand-in for your app. It keeps its users in its own PostgreSQL database (not siwa's) and reacts to
the six change types. The webhook endpoint and the changefeed reader call `apply_change` inside a
transaction of the app's database that also records "this change is done" (a webhook-id or the
changefeed's cursor), so the effect and that record commit together or not at all.

`data` has the shape of a webhook body's `data` (docs/webhooks.md, "What is sent"); the changefeed
reader builds the same dictionary from a row of siwa.changefeed.
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS app_users (
    sub               text PRIMARY KEY,        -- the user's Sign in with Apple identifier
    email             text,                    -- what Apple gave us (maybe a private relay address)
    email_forwarding  boolean,                 -- false: Apple's relay drops our mail to that address
    signed_out_before timestamptz,             -- sessions created before this are no longer valid
    deleted_at        timestamptz              -- the user deleted the Apple account
);
-- What the app did, one row per change it acted on: the effect that must happen once. (A real app
-- would send a mail, cancel a subscription, enqueue a job: things that must not happen twice.)
CREATE TABLE IF NOT EXISTS app_audit (
    id         bigserial PRIMARY KEY,
    change_id  bigint      NOT NULL,           -- data.change_id: the change's identity at siwa
    type       text        NOT NULL,
    sub        text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
"""


def create_schema(conn):
    """Creates the app's tables (idempotent), in their own transaction."""
    with conn.transaction():
        conn.execute(SCHEMA)


def apply_change(conn, change_type: str, data: dict) -> None:
    """Applies one change to the app's tables, on `conn`, inside the caller's transaction.

    Every statement is written so that replaying a change would not harm the state (the latest time
    wins), but the audit row is not: the caller's dedupe makes it once.
    """
    sub = data["sub"]
    if change_type in ("siwa.consent_revoked", "siwa.account_deleted"):
        # Sign the user out everywhere: sessions created before the event are invalid.
        conn.execute(
            """INSERT INTO app_users (sub, signed_out_before) VALUES (%s, %s)
               ON CONFLICT (sub) DO UPDATE
                  SET signed_out_before = greatest(app_users.signed_out_before, excluded.signed_out_before)""",
            (sub, data["event_time"]))
        if change_type == "siwa.account_deleted":
            conn.execute("UPDATE app_users SET deleted_at = coalesce(deleted_at, %s) WHERE sub = %s",
                         (data["event_time"], sub))
    elif change_type == "siwa.personal_data_erased":
        # siwa erased what it held about the user: erase the personal data the app received from it
        # (here the email that earlier email events carried). Subscribe to this type, or the app keeps it.
        conn.execute("UPDATE app_users SET email = NULL, email_forwarding = NULL WHERE sub = %s", (sub,))
    elif change_type in ("siwa.email_disabled", "siwa.email_enabled"):
        # Apple's relay stopped (or resumed) forwarding mail to the user's private address.
        conn.execute(
            """INSERT INTO app_users (sub, email, email_forwarding) VALUES (%s, %s, %s)
               ON CONFLICT (sub) DO UPDATE SET email = coalesce(excluded.email, app_users.email),
                                               email_forwarding = excluded.email_forwarding""",
            (sub, data.get("email"), change_type == "siwa.email_enabled"))
    elif change_type == "siwa.sub_transferred":
        # A team transfer: the user the app knew as old_sub is sub from now on.
        conn.execute("UPDATE app_users SET sub = %s WHERE sub = %s", (sub, data["old_sub"]))
    else:
        return  # a type this app does not know (a newer siwa): nothing to do, and no audit row
    conn.execute("INSERT INTO app_audit (change_id, type, sub) VALUES (%s, %s, %s)",
                 (data["change_id"], change_type, sub))

-- Data moves: change 3's rows into the log and queue, and the month partitions ahead

-- Change 3 (schema/10-numbered-changes.sql) renamed version 2's siwa.notifications to
-- siwa.notifications_v2; its rows move here, in the same transaction and under the migrate lock, into
-- the log (ids, states, attempts, errors, erasure as they were; a month partition for every month of
-- issued_at they cover) and, while pending, into the queue (next attempt, attempts, busy state, error).
-- The old table is dropped only after that. Last of the desired state's statements but the grants: it
-- needs the log, the queue and siwa.create_log_partition(s) of schema/45-retention.sql.
DO $$
DECLARE
    v_month date;
    v_max   bigint;
BEGIN
    LOCK TABLE siwa.schema_version IN SHARE ROW EXCLUSIVE MODE;
    IF pg_catalog.to_regclass('siwa.notifications_v2') IS NOT NULL THEN
        FOR v_month IN
            SELECT DISTINCT pg_catalog.date_trunc('month', o.issued_at AT TIME ZONE 'UTC')::date
              FROM siwa.notifications_v2 o
        LOOP
            PERFORM siwa.create_log_partition(v_month);
        END LOOP;
        INSERT INTO siwa.notification_log (id, jti, event_type, sub, audience, email, is_private_email,
                                           event_time, issued_at, expires_at, raw_token, received_at, state,
                                           attempts, applied_at, last_error, personal_data_erased_at)
        OVERRIDING SYSTEM VALUE
        SELECT o.id, o.jti, o.event_type, o.sub, o.audience, o.email, o.is_private_email, o.event_time,
               o.issued_at, o.expires_at, o.raw_token, o.received_at, o.state, o.attempts, o.applied_at,
               o.last_error, o.personal_data_erased_at
          FROM siwa.notifications_v2 o
         ORDER BY o.id;
        -- The pending ones are queued, with their next attempt, attempts, busy state and error.
        INSERT INTO siwa.notification_queue (id, jti, issued_at, received_at, next_attempt_at, attempts,
                                             busy_since, last_error)
        SELECT o.id, o.jti, o.issued_at, o.received_at, o.next_attempt_at, o.attempts, o.busy_since, o.last_error
          FROM siwa.notifications_v2 o
         WHERE o.state = 'pending';
        -- Dedupe keys of the tokens still inside the window (version 2 kept every jti unique forever;
        -- past the window the receiver refuses a token for its age).
        INSERT INTO siwa.notification_jtis (jti, issued_at, expires_at)
        SELECT o.jti, o.issued_at, o.expires_at
          FROM siwa.notifications_v2 o
         WHERE o.issued_at >= pg_catalog.now() - interval '7 days' OR o.expires_at > pg_catalog.now();
        v_max := (SELECT pg_catalog.max(o.id) FROM siwa.notifications_v2 o);
        IF v_max IS NOT NULL THEN
            PERFORM pg_catalog.setval(pg_catalog.pg_get_serial_sequence('siwa.notification_log', 'id'), v_max);
        END IF;
        IF (SELECT pg_catalog.count(*) FROM siwa.notifications_v2)
           <> (SELECT pg_catalog.count(*) FROM siwa.notification_log l
                WHERE l.id <= coalesce(v_max, 0)) THEN
            RAISE EXCEPTION 'change 3 did not move every notification; nothing was changed';
        END IF;
        DROP TABLE siwa.notifications_v2;
        DROP FUNCTION IF EXISTS siwa.notify_workers_requeued();
        DROP FUNCTION IF EXISTS siwa.notify_workers();
    END IF;
    -- This month and the next (the worker's maintenance keeps it so). Only one ahead: every statement
    -- on the log that cannot prune by issued_at (erasure by sub) plans and opens every partition.
    PERFORM siwa.create_log_partitions(1);
END;
$$;

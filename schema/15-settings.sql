-- Settings the database itself acts on (siwa.settings, one row)

CREATE TABLE IF NOT EXISTS siwa.settings (
    singleton                     boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    erase_personal_data_after     interval NOT NULL DEFAULT interval '0' CHECK (erase_personal_data_after >= interval '0'),
    hook_search_path              text,
    changes_retention             interval NOT NULL DEFAULT interval '7 days'
        CONSTRAINT settings_changes_retention_check CHECK (changes_retention >= interval '0'),
    -- auto-disable (numbered change 5 adds it to an existing table)
    webhook_auto_disable_after    interval NOT NULL DEFAULT interval '3 days'
        CONSTRAINT settings_webhook_auto_disable_after_check CHECK (webhook_auto_disable_after > interval '0'),
    -- the relay-mail gate (numbered change 5 adds it to an existing table)
    relay_mail_after_consent_revoked text NOT NULL DEFAULT 'allow'
        CONSTRAINT settings_relay_mail_after_consent_revoked_check
            CHECK (relay_mail_after_consent_revoked IN ('allow', 'block'))
);
COMMENT ON TABLE siwa.settings IS
    'Settings read by the database functions; exactly one row. Change with UPDATE siwa.settings SET ….';
COMMENT ON COLUMN siwa.settings.singleton IS 'Always true: keeps this table to a single row.';
COMMENT ON COLUMN siwa.settings.erase_personal_data_after IS
    'How long after an account-delete event the account''s personal data (email, raw tokens) is kept. 0 (default): erased in the same transaction that applies the deletion; otherwise erased by the worker''s maintenance pass once deleted_at + this interval has passed.';
COMMENT ON COLUMN siwa.settings.hook_search_path IS
    'The search_path the admins'' hook siwa.on_event is called with. NULL (default): the worker session''s own search_path (its role''s or connection''s setting, PostgreSQL''s default "$user", public), as a hook written without schema names expects. A hook with its own SET search_path clause (recommended) uses that instead.';
COMMENT ON COLUMN siwa.settings.changes_retention IS
    'How long a numbered change (siwa.changes) is kept after it was applied before siwa.prune deletes it: the longest a changefeed reader may stay away and still catch up. 7 days by default.';
COMMENT ON COLUMN siwa.settings.webhook_auto_disable_after IS
    'How long a webhook endpoint may fail continuously (no 2xx to any attempt) before siwa-worker disables it (siwa.webhook_endpoints.disabled_reason). 3 days by default; a 410 Gone disables it at once.';
COMMENT ON COLUMN siwa.settings.relay_mail_after_consent_revoked IS
    'What the relay-mail gate answers for an address whose user revoked consent (consent-revoked) and has neither turned forwarding on nor signed in since: allow (default: Apple keeps the relay address forwarding until the user turns it off, which Apple tells with email-disabled) or block (reason consent_revoked, for teams that stop mailing users who left). docs/sql.md.';
INSERT INTO siwa.settings DEFAULT VALUES ON CONFLICT DO NOTHING;

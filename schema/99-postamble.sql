-- The applying session's own search_path restored

-- The applying session gets its own search_path back (psql ends anyway; a longer session goes on).
DO $$
BEGIN
    PERFORM pg_catalog.set_config('search_path',
                                  pg_catalog.current_setting('siwa.schema_sql_saved_search_path'), false);
END;
$$;

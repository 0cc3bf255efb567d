"""PostgreSQL: the audit append as one server-side function (decision 62).

Appending to the hash chain needs the last event's id and hash, so appends are serialised by the
`audit_head` row lock. Done from the gateway, the lock was held across four client round trips
(lock, insert, move the head, the card) and the commit: under load each round trip waits for
the gateway process to be scheduled again, and every other gateway waits behind it.
`gateway_audit_append` does all of it inside the server, in the one statement the gateway sends
in autocommit: the lock is held while the server works and commits, never while a client runs.

The gateway (gateway/audit.py) sends each event's fields and its canonical JSON cut around the
id, which only the server knows under the lock: `head` is the UTF-8 bytes up to `"id":`, `tail`
those after the id's digits, so the server's hash is
`sha256(prev_hash || head || id || tail)`, byte for byte the `chain_hash` the gateway's `audit
verify` recomputes. The card writes of gateway/calls.py (`p_cards`, a JSON array) follow, with
the last event's id as their `last_event_id`. SQLite keeps the gateway's own append: its writers
are serialised by the file's lock whatever the round trips, which cost nothing in process.
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

APPEND = """
CREATE OR REPLACE FUNCTION gateway_audit_append(
    p_ts text,
    p_types text[],
    p_run_ids text[],
    p_users text[],
    p_workspaces text[],
    p_tool_names text[],
    p_args_hashes text[],
    p_codes integer[],
    p_details text[],
    p_heads bytea[],
    p_tails bytea[],
    p_cards jsonb
) RETURNS TABLE (o_id bigint, o_prev_hash text, o_hash text)
LANGUAGE plpgsql
AS $append$
DECLARE
    v_id bigint;
    v_prev text;
    v_hash text;
    v_card jsonb;
BEGIN
    SELECT h.last_id, h.last_hash INTO v_id, v_prev FROM audit_head AS h WHERE h.id = 1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'audit_head has no row: the audit log was not initialised (mcp-gateway init)';
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_types, 1), 0) LOOP
        v_id := v_id + 1;
        v_hash := encode(
            sha256(convert_to(v_prev, 'UTF8') || p_heads[i] || convert_to(v_id::text, 'UTF8') || p_tails[i]), 'hex'
        );
        INSERT INTO audit_events
            (id, ts, event_type, run_id, user_name, workspace, tool_name, args_hash, code, detail, prev_hash, hash)
        VALUES
            (v_id, p_ts, p_types[i], p_run_ids[i], p_users[i], p_workspaces[i], p_tool_names[i],
             p_args_hashes[i], p_codes[i], p_details[i], v_prev, v_hash);
        o_id := v_id;
        o_prev_hash := v_prev;
        o_hash := v_hash;
        RETURN NEXT;
        v_prev := v_hash;
    END LOOP;
    UPDATE audit_head SET last_id = v_id, last_hash = v_prev WHERE id = 1;
    FOR v_card IN SELECT value FROM jsonb_array_elements(coalesce(p_cards, '[]'::jsonb)) LOOP
        IF v_card->>'op' = 'open' THEN
            INSERT INTO tool_calls
                (run_id, kind, created_at, updated_at, user_name, workspace, server_id, tool_name,
                 arguments, status, code, reason, message, result, last_event_id)
            VALUES
                (v_card->>'run_id', v_card->>'kind', (v_card->>'created_at')::double precision,
                 (v_card->>'updated_at')::double precision, v_card->>'user_name', v_card->>'workspace',
                 v_card->>'server_id', v_card->>'tool_name', v_card->>'arguments', v_card->>'status',
                 (v_card->>'code')::integer, v_card->>'reason', v_card->>'message', v_card->>'result', v_id);
        ELSIF v_card->>'op' = 'move' THEN
            UPDATE tool_calls SET
                status = v_card->>'status',
                updated_at = (v_card->>'now')::double precision,
                last_event_id = v_id,
                workspace = coalesce(v_card->>'workspace', workspace),
                code = coalesce((v_card->>'code')::integer, code),
                reason = coalesce(v_card->>'reason', reason),
                message = coalesce(v_card->>'message', message),
                result = coalesce(v_card->>'result', result)
            WHERE run_id = v_card->>'run_id';
        ELSE
            RAISE EXCEPTION 'gateway_audit_append: unknown card write %', v_card->>'op';
        END IF;
    END LOOP;
END
$append$
"""

SIGNATURE = "gateway_audit_append(text, text[], text[], text[], text[], text[], text[], integer[], text[], bytea[], bytea[], jsonb)"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")

"""A call's decision and terminal event, each recorded at most once (decision 67): `call_ends`.

A gateway whose lease ran out while its database work queued behind a held lock was judged gone;
another gateway closed its consent question as abandoned (a decision and a POLICY_BLOCKED), and
the live one, at its question's expiry, wrote a second decision and a second POLICY_BLOCKED for
the same call. Now every audit append records a call's decision (`decision`) and its terminal
event (`end`) in `call_ends` under the chain's lock, and an append that would record a second one
writes nothing (gateway/audit.py on SQLite; `gateway_audit_append` below on PostgreSQL).

The table is filled from the events already written (the first of each), so the rule holds for
calls that were open before the upgrade too.
"""

import importlib

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

BACKFILL = """
INSERT INTO call_ends (run_id, kind, event_id)
SELECT run_id, CASE WHEN event_type = 'mcp.permission.decision' THEN 'decision' ELSE 'end' END, MIN(id)
FROM audit_events
WHERE run_id IS NOT NULL AND event_type IN ('mcp.permission.decision', 'POLICY_BLOCKED', 'TOOL_FINISHED')
GROUP BY run_id, CASE WHEN event_type = 'mcp.permission.decision' THEN 'decision' ELSE 'end' END
"""

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
    v_kind text;
BEGIN
    SELECT h.last_id, h.last_hash INTO v_id, v_prev FROM audit_head AS h WHERE h.id = 1 FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'audit_head has no row: the audit log was not initialised (mcp-gateway init)';
    END IF;
    -- A call's second decision or second terminal event: the whole append is not written (no row
    -- returned). Appends are serialised by the lock above, so the check and the inserts below agree.
    FOR i IN 1 .. coalesce(array_length(p_types, 1), 0) LOOP
        v_kind := CASE WHEN p_types[i] = 'mcp.permission.decision' THEN 'decision'
                       WHEN p_types[i] IN ('POLICY_BLOCKED', 'TOOL_FINISHED') THEN 'end' END;
        IF v_kind IS NOT NULL AND p_run_ids[i] IS NOT NULL AND EXISTS (
            SELECT 1 FROM call_ends AS c WHERE c.run_id = p_run_ids[i] AND c.kind = v_kind
        ) THEN
            RETURN;
        END IF;
    END LOOP;
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
        v_kind := CASE WHEN p_types[i] = 'mcp.permission.decision' THEN 'decision'
                       WHEN p_types[i] IN ('POLICY_BLOCKED', 'TOOL_FINISHED') THEN 'end' END;
        IF v_kind IS NOT NULL AND p_run_ids[i] IS NOT NULL THEN
            INSERT INTO call_ends (run_id, kind, event_id) VALUES (p_run_ids[i], v_kind, v_id)
            ON CONFLICT DO NOTHING;
        END IF;
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


def upgrade() -> None:
    op.create_table(
        "call_ends",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), primary_key=True),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
    )
    op.execute(BACKFILL)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(APPEND)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(importlib.import_module("gateway.db.migrations.versions.0008_audit_append_function").APPEND)
    op.drop_table("call_ends")

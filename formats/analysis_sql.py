"""The analyses as SQL views: every number of ``neuron-profile analyze`` reproducible by a query.

``neuron-profile query DIR`` (``formats.query``) creates these views next to the table views; their
definitions are the ones of ``formats.critical_path`` (docs/analyses.md), written in SQL:

* ``analysis_windows``  -- each execution's [start, end) on the device clock (``profile``,
  ``execution``: 0, 1, ... in time order);
* ``analysis_events``   -- instructions, DMA transfers (packets grouped by ``packet_aggregation_id``)
  and collectives in one table: ``kind`` (0/1/2), ``kind_name`` (as ``Flow`` names tables), ``id``,
  ``start_ts``, ``end_ts``, ``lane`` (timeline row, queue or operation), ``engine``, op, layer, source;
* ``analysis_release``  -- per event its releasing predecessor (``pred_kind``, ``pred_id``,
  ``pred_end``, ``implicit``);
* ``analysis_critical_path`` -- the path, last event first (``step``), with each event's
  ``contribution_ns`` and ``wait_ns``; a ``host`` row (step -1) per execution whose window ends after
  its last event, so ``sum(contribution_ns)`` is the path length;
* ``analysis_idle``     -- every idle interval of every engine with its ``cause``.

They are plain SQL over the table views (recursive for the path), so they are exact but not fast:
the compiled implementation is for large profiles; these are for checking it and for ad-hoc
questions (tests compare the two on captured profiles).
"""

from __future__ import annotations

__all__ = ["VIEWS", "view_statements"]

VIEWS = ("analysis_windows", "analysis_events", "analysis_release", "analysis_critical_path",
         "analysis_idle")


def view_statements(single: bool) -> list[str]:
    """``CREATE VIEW`` statements over the table views (``single``: one profile, no ``profile`` column)."""
    p = "'.'" if single else "profile"
    return [
        f"""CREATE VIEW analysis_windows AS
WITH origin AS (
    SELECT {p} AS profile, min(first_hw_timestamp) AS t0 FROM Metadata GROUP BY 1),
span AS (
    SELECT profile, min(s) AS s, max(e) AS e FROM (
        SELECT {p} AS profile, start_ts AS s, end_ts AS e FROM Instruction
        UNION ALL SELECT {p}, start_ts, end_ts FROM DmaPacket
        UNION ALL SELECT {p}, start_ts, end_ts FROM CcOp) GROUP BY 1),
info AS (
    SELECT {p} AS profile, execution_start_ts AS a, execution_end_ts AS b FROM ExecutionInfo
    WHERE execution_start_ts IS NOT NULL AND execution_end_ts IS NOT NULL),
raw AS (
    SELECT span.profile, row_number() OVER (PARTITION BY span.profile ORDER BY info.a) - 1 AS execution,
           coalesce(origin.t0, span.s) + info.a AS start_ts, coalesce(origin.t0, span.s) + info.b AS end_ts
    FROM span JOIN info ON info.profile = span.profile LEFT JOIN origin ON origin.profile = span.profile
    UNION ALL
    SELECT span.profile, 0, coalesce(m.first_hw_timestamp, span.s),
           CASE WHEN m.last_hw_timestamp > m.first_hw_timestamp THEN m.last_hw_timestamp ELSE span.e END
    FROM span LEFT JOIN (SELECT {p} AS profile, min(first_hw_timestamp) AS first_hw_timestamp,
                                max(last_hw_timestamp) AS last_hw_timestamp FROM Metadata GROUP BY 1) m
              ON m.profile = span.profile
    WHERE NOT EXISTS (SELECT 1 FROM info WHERE info.profile = span.profile)),
assigned AS (  -- each event to the last execution starting at or before it (the first one if none)
    SELECT ev.profile, coalesce((SELECT max(r.execution) FROM raw r WHERE r.profile = ev.profile
                                 AND r.start_ts <= ev.s), 0) AS execution, min(ev.s) AS s, max(ev.e) AS e
    FROM (SELECT {p} AS profile, start_ts AS s, end_ts AS e FROM Instruction
          UNION ALL SELECT {p}, start_ts, end_ts FROM DmaPacket
          UNION ALL SELECT {p}, start_ts, end_ts FROM CcOp) ev GROUP BY ev.profile, 2)
SELECT raw.profile, raw.execution, least(raw.start_ts, coalesce(a.s, raw.start_ts)) AS start_ts,
       greatest(raw.end_ts, coalesce(a.e, raw.end_ts)) AS end_ts
FROM raw LEFT JOIN assigned a ON a.profile = raw.profile AND a.execution = raw.execution""",
        f"""CREATE VIEW analysis_events AS
WITH ev AS (
    SELECT {p} AS profile, 0 AS kind, 'instruction' AS kind_name, id, start_ts, end_ts,
           coalesce(timeline_track, engine) AS lane, engine, hlo_name, layer,
           bir_debug_info_source_location AS source FROM Instruction
    UNION ALL
    SELECT {p}, 1, 'dma_block', packet_aggregation_id, min(start_ts), max(end_ts),
           min(coalesce(queue_name, 'queue ' || queue_idx::VARCHAR, 'DMA')), NULL, NULL, NULL, NULL
    FROM DmaPacket GROUP BY 1, packet_aggregation_id
    UNION ALL
    SELECT {p}, 2, 'cc_op', op_id, start_ts, end_ts, coalesce(operation, 'collective'), NULL, NULL, NULL, NULL
    FROM CcOp)
SELECT ev.*, coalesce((SELECT max(w.execution) FROM analysis_windows w WHERE w.profile = ev.profile
                       AND w.start_ts <= ev.start_ts), 0) AS execution
FROM ev""",
        """CREATE VIEW analysis_release AS
WITH cand AS (
    SELECT profile, kind, id, start_ts, 0 AS pkind, lag(id) OVER w AS pid, lag(end_ts) OVER w AS pend
    FROM analysis_events WHERE kind = 0
    WINDOW w AS (PARTITION BY profile, lane ORDER BY start_ts, id)
    UNION ALL
    SELECT t.profile, t.kind, t.id, t.start_ts, s.kind, s.id, s.end_ts
    FROM Flow f
    JOIN analysis_events s ON s.kind_name = lower(f.in_table) AND s.id = f.in_id
    JOIN analysis_events t ON t.kind_name = lower(f.out_table) AND t.id = f.out_id AND t.profile = s.profile
    WHERE NOT (s.kind = t.kind AND s.id = t.id)),
explicit AS (
    SELECT profile, kind, id,
           max({'e': pend, 'k': pkind, 'i': pid}) FILTER (WHERE pid IS NOT NULL AND pend <= start_ts) AS best
    FROM cand GROUP BY 1, 2, 3),
chosen AS (
    SELECT e.profile, e.kind, e.id, e.start_ts, e.execution, x.best.e AS xe, x.best.k AS xk, x.best.i AS xi
    FROM analysis_events e LEFT JOIN explicit x ON x.profile = e.profile AND x.kind = e.kind AND x.id = e.id)
SELECT c.profile, c.kind, c.id,
       CASE WHEN imp.id IS NOT NULL THEN imp.kind ELSE c.xk END AS pred_kind,
       CASE WHEN imp.id IS NOT NULL THEN imp.id ELSE c.xi END AS pred_id,
       CASE WHEN imp.id IS NOT NULL THEN imp.end_ts ELSE c.xe END AS pred_end,
       imp.id IS NOT NULL AS implicit
FROM chosen c
LEFT JOIN LATERAL (
    SELECT q.kind, q.id, q.end_ts FROM analysis_events q
    WHERE c.kind <> 1 AND (c.xe IS NULL OR c.xe < c.start_ts)
      AND q.profile = c.profile AND q.execution = c.execution AND q.end_ts <= c.start_ts
      AND q.start_ts < c.start_ts AND q.end_ts > coalesce(c.xe, -9223372036854775807)
    ORDER BY q.end_ts DESC, q.kind DESC, q.id DESC LIMIT 1) imp ON true""",
        """CREATE VIEW analysis_critical_path AS
WITH RECURSIVE ev AS MATERIALIZED (SELECT * FROM analysis_events),
rel AS MATERIALIZED (
    SELECT r.profile, r.kind, r.id, r.pred_kind, r.pred_id, pe.execution AS pred_execution
    FROM analysis_release r JOIN ev pe ON pe.profile = r.profile AND pe.kind = r.pred_kind
    AND pe.id = r.pred_id),
last AS (
    SELECT profile, execution, arg_max({'kind': kind, 'id': id}, {'e': end_ts, 'k': kind, 'i': id}) AS ev
    FROM ev GROUP BY 1, 2),
path(profile, execution, step, kind, id) AS (
    SELECT profile, execution, 0, ev.kind, ev.id FROM last
    UNION ALL
    SELECT path.profile, path.execution, path.step + 1, r.pred_kind, r.pred_id
    FROM path JOIN rel r ON r.profile = path.profile AND r.kind = path.kind AND r.id = path.id
    WHERE r.pred_execution = path.execution)
SELECT path.profile, path.execution, path.step, e.kind_name, e.id, e.start_ts, e.end_ts, e.lane, e.engine,
       e.hlo_name, e.layer, e.source,
       e.end_ts - least(coalesce(pe.end_ts, w.start_ts), e.start_ts) AS contribution_ns,
       e.start_ts - least(coalesce(pe.end_ts, w.start_ts), e.start_ts) AS wait_ns,
       coalesce(r.implicit, false) AS implicit
FROM path
JOIN analysis_events e ON e.profile = path.profile AND e.kind = path.kind AND e.id = path.id
JOIN analysis_windows w ON w.profile = path.profile AND w.execution = path.execution
LEFT JOIN analysis_release r ON r.profile = e.profile AND r.kind = e.kind AND r.id = e.id
LEFT JOIN analysis_events pe ON pe.profile = r.profile AND pe.kind = r.pred_kind AND pe.id = r.pred_id
     AND pe.execution = path.execution
UNION ALL  -- host: from the last event's end to the window's end (step -1)
SELECT w.profile, w.execution, -1, 'host', NULL, coalesce(l.e, w.start_ts), w.end_ts, 'host', NULL, NULL,
       NULL, NULL, w.end_ts - coalesce(l.e, w.start_ts), 0, false
FROM analysis_windows w
LEFT JOIN (SELECT profile, execution, max(end_ts) AS e FROM analysis_events GROUP BY 1, 2) l
       ON l.profile = w.profile AND l.execution = w.execution
WHERE w.end_ts > coalesce(l.e, w.start_ts)""",
        """CREATE VIEW analysis_idle AS
WITH instr AS (
    SELECT e.*, max(end_ts) OVER (PARTITION BY e.profile, e.engine, e.execution ORDER BY e.start_ts, e.id
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
    FROM analysis_events e WHERE kind = 0 AND engine IS NOT NULL),
engines AS (SELECT DISTINCT profile, engine FROM instr),
gaps AS (
    SELECT i.profile, i.engine, i.execution, greatest(coalesce(i.before, w.start_ts), w.start_ts) AS start_ts,
           i.start_ts AS end_ts, i.id AS waiter, i.hlo_name, i.layer, w.start_ts AS window_start
    FROM instr i JOIN analysis_windows w ON w.profile = i.profile AND w.execution = i.execution
    WHERE i.start_ts > greatest(coalesce(i.before, w.start_ts), w.start_ts)
    UNION ALL  -- after the engine's last instruction of a execution, and windows it did not run in
    SELECT en.profile, en.engine, w.execution, coalesce(t.reach, w.start_ts), w.end_ts, NULL, NULL, NULL,
           w.start_ts
    FROM engines en JOIN analysis_windows w ON w.profile = en.profile
    LEFT JOIN (SELECT profile, engine, execution, max(end_ts) AS reach FROM instr GROUP BY 1, 2, 3) t
           ON t.profile = en.profile AND t.engine = en.engine AND t.execution = w.execution
    WHERE w.end_ts > coalesce(t.reach, w.start_ts))
SELECT g.profile, g.engine, g.execution, g.start_ts, g.end_ts, g.end_ts - g.start_ts AS idle_ns, g.waiter,
       g.hlo_name, g.layer, r.pred_kind, r.pred_id,
       CASE WHEN g.waiter IS NULL THEN 'starved'
            WHEN r.pred_id IS NULL THEN CASE WHEN g.start_ts = g.window_start THEN 'host' ELSE 'starved' END
            WHEN r.pred_end <= g.start_ts THEN 'starved'
            WHEN r.pred_kind = 1 THEN 'dma:' || p.lane
            WHEN r.pred_kind = 2 THEN 'collective:' || p.lane
            ELSE 'engine:' || coalesce(p.engine, p.lane) END AS cause
FROM gaps g
LEFT JOIN analysis_release r ON r.profile = g.profile AND r.kind = 0 AND r.id = g.waiter
LEFT JOIN analysis_events p ON p.profile = r.profile AND p.kind = r.pred_kind AND p.id = r.pred_id""",
    ]

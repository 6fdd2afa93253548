/**
 * Versioned schema migrations, applied in order by migrate.ts. Never edit a released migration:
 * add a new one. Each table's queries live in its store (orders-store.ts, ...).
 */
export interface Migration {
  version: number;
  name: string;
  sql: string;
}

export const migrations: readonly Migration[] = [
  {
    version: 1,
    name: 'orders-journal-stock',
    sql: `
CREATE TABLE orders (
  id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  reservation_id text        NOT NULL UNIQUE,
  activity_id    text        NOT NULL,
  user_id        text        NOT NULL,
  sku_id         text        NOT NULL,
  slot           smallint    NOT NULL CHECK (slot >= 1),
  quantity       integer     NOT NULL CHECK (quantity >= 1),
  unit_price     numeric(14,2) NOT NULL CHECK (unit_price >= 0),
  amount         numeric(16,2) NOT NULL CHECK (amount >= 0),
  item_name      text        NOT NULL,
  status         text        NOT NULL CHECK (status IN ('UNPAID','PAID','CLOSED','REFUNDING','REFUNDED')),
  close_reason   text,
  trace_id       text        NOT NULL DEFAULT '',
  reserved_at    timestamptz NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now(),
  expires_at     timestamptz NOT NULL,
  paid_at        timestamptz,
  closed_at      timestamptz,
  stock_returned boolean     NOT NULL DEFAULT false
);
-- The per-buyer limit as a database key: one live order per (activity, buyer, sku, slot).
CREATE UNIQUE INDEX orders_live_buyer_slot ON orders (activity_id, user_id, sku_id, slot)
  WHERE status <> 'CLOSED';
CREATE INDEX orders_unpaid_expiry ON orders (expires_at) WHERE status = 'UNPAID';
CREATE INDEX orders_activity_status ON orders (activity_id, status);

-- Source 003's flow table: one row per state change, with the trace id of the request.
CREATE TABLE order_journal (
  id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  activity_id    text        NOT NULL,
  reservation_id text        NOT NULL,
  order_id       bigint,
  event          text        NOT NULL,
  from_status    text,
  to_status      text,
  trace_id       text        NOT NULL DEFAULT '',
  detail         jsonb       NOT NULL DEFAULT '{}'::jsonb,
  created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX order_journal_reservation ON order_journal (reservation_id);
CREATE INDEX order_journal_activity ON order_journal (activity_id, created_at);

-- Remaining stock after write-back; PostgreSQL is the source of truth from then on.
CREATE TABLE activity_stock (
  activity_id    text    NOT NULL,
  sku_id         text    NOT NULL,
  initial_stock  integer NOT NULL CHECK (initial_stock >= 0),
  remaining      integer NOT NULL CHECK (remaining >= 0),
  updated_at     timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (activity_id, sku_id)
);

-- The write-back fence: one row per activity, inserted in the transaction that writes the stock.
CREATE TABLE activity_writebacks (
  activity_id     text    PRIMARY KEY,
  generation      bigint  NOT NULL,
  initial_total   bigint  NOT NULL,
  remaining_total bigint  NOT NULL,
  reserved_total  bigint  NOT NULL,
  released_total  bigint  NOT NULL,
  orders_total    bigint  NOT NULL,
  written_by      text    NOT NULL,
  written_at      timestamptz NOT NULL DEFAULT now()
);

-- Items an activity can load by catalogRef instead of listing them inline.
CREATE TABLE catalog_items (
  catalog        text    NOT NULL,
  sku_id         text    NOT NULL,
  name           text    NOT NULL,
  price          numeric(14,2) NOT NULL CHECK (price >= 0),
  stock          integer NOT NULL CHECK (stock > 0),
  limit_per_user integer NOT NULL DEFAULT 1 CHECK (limit_per_user >= 1),
  PRIMARY KEY (catalog, sku_id)
);
`,
  },
  {
    version: 2,
    name: 'payments-compensation-reconciliation',
    sql: `
-- Where a closed order's stock went (exactly once): 'redis' (release-6.lua while the cache was
-- live), 'postgres' (activity_stock after write-back) or 'unresolved' (cannot be proven either
-- way: flagged for a human, never returned twice). stock_returned stays the boolean truth.
ALTER TABLE orders ADD COLUMN stock_return_via text
  CHECK (stock_return_via IN ('redis', 'postgres', 'unresolved'));
-- Set just before a Redis release is attempted: after a cache cleanup it tells whether Redis may
-- already hold the returned stock (in the write-back snapshot) or certainly does not.
ALTER TABLE orders ADD COLUMN stock_release_attempted_at timestamptz;
ALTER TABLE orders ADD CONSTRAINT orders_stock_returned_via
  CHECK (NOT stock_returned OR stock_return_via IN ('redis', 'postgres'));
CREATE INDEX orders_closed_stock_pending ON orders (activity_id, closed_at)
  WHERE status = 'CLOSED' AND NOT stock_returned AND stock_return_via IS NULL;

-- Source 004: one row per real payment, keyed by (provider, trade_no); RECEIVED only inside the
-- transaction that applies it.
CREATE TABLE payments (
  provider       text          NOT NULL,
  trade_no       text          NOT NULL CHECK (length(trade_no) BETWEEN 1 AND 128),
  order_id       bigint        NOT NULL REFERENCES orders (id),
  activity_id    text          NOT NULL,
  reservation_id text          NOT NULL,
  amount         numeric(16,2) NOT NULL CHECK (amount > 0),
  state          text          NOT NULL CHECK (state IN ('RECEIVED', 'APPLIED', 'REFUND_PENDING')),
  refund_reason  text,
  trace_id       text          NOT NULL DEFAULT '',
  notification   jsonb         NOT NULL DEFAULT '{}'::jsonb,
  received_at    timestamptz   NOT NULL DEFAULT now(),
  updated_at     timestamptz   NOT NULL DEFAULT now(),
  PRIMARY KEY (provider, trade_no),
  CHECK ((state = 'REFUND_PENDING') = (refund_reason IS NOT NULL))
);
CREATE INDEX payments_order ON payments (order_id);
-- At most one payment is ever applied to an order, whatever the application does.
CREATE UNIQUE INDEX payments_one_applied ON payments (order_id) WHERE state = 'APPLIED';
CREATE INDEX payments_refund_pending ON payments (received_at) WHERE state = 'REFUND_PENDING';

-- One row per reconciliation run (Redis counters, the reservation ledger and PostgreSQL).
CREATE TABLE reconciliation_reports (
  id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  activity_id    text        NOT NULL,
  basis          text        NOT NULL CHECK (basis IN ('redis', 'postgres', 'skipped')),
  ok             boolean     NOT NULL,
  mismatches     jsonb       NOT NULL DEFAULT '[]'::jsonb,
  figures        jsonb       NOT NULL DEFAULT '{}'::jsonb,
  created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reconciliation_reports_activity ON reconciliation_reports (activity_id, created_at DESC);

-- Order-gap repair bookkeeping: how often a reservation was re-published (bounded, spaced out).
CREATE TABLE order_gap_repairs (
  activity_id    text        NOT NULL,
  reservation_id text        NOT NULL,
  attempts       integer     NOT NULL DEFAULT 0,
  last_action    text        NOT NULL,
  last_at        timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (activity_id, reservation_id)
);
`,
  },
  {
    version: 7,
    name: 'activity-skus-guard',
    sql: `
-- The last guard against overselling (seeds 002 and 003): each SKU's stock and buyer limit as
-- PostgreSQL knows them, written by the operator before the cache is loaded (or, for an activity
-- loaded some other way, seeded once from the cache by the consumer). sold = the quantity of the
-- SKU's live (not CLOSED) orders; the consumer closes what would take it above stock in the same
-- transaction as the order inserts (core/stock-guard.ts).
CREATE TABLE activity_skus (
  activity_id    text          NOT NULL,
  sku_id         text          NOT NULL,
  stock          integer       NOT NULL CHECK (stock >= 0),
  limit_per_user integer       NOT NULL CHECK (limit_per_user >= 1),
  unit_price     numeric(14,2) NOT NULL CHECK (unit_price >= 0),
  item_name      text          NOT NULL,
  sold           integer       NOT NULL DEFAULT 0,
  seeded_from    text          NOT NULL CHECK (seeded_from IN ('spec', 'cache')),
  created_at     timestamptz   NOT NULL DEFAULT now(),
  updated_at     timestamptz   NOT NULL DEFAULT now(),
  PRIMARY KEY (activity_id, sku_id)
);

-- sold follows every change of an order's liveness, whichever code path makes it (consumer
-- inserts, payment-timeout and cancellation closes, gap compensation, a closed order taken back):
-- one statement-level trigger per verb, aggregated per SKU, rows locked in (activity, sku) order
-- so two transactions never wait on each other's SKU rows in opposite orders.
CREATE FUNCTION activity_skus_track_sold() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
  d record;
BEGIN
  IF TG_OP = 'INSERT' THEN
    FOR d IN SELECT activity_id, sku_id, sum(quantity)::int AS q FROM new_rows
              WHERE status <> 'CLOSED' GROUP BY 1, 2 ORDER BY 1, 2 LOOP
      UPDATE activity_skus SET sold = sold + d.q
       WHERE activity_id = d.activity_id AND sku_id = d.sku_id;
    END LOOP;
  ELSIF TG_OP = 'DELETE' THEN
    FOR d IN SELECT activity_id, sku_id, sum(quantity)::int AS q FROM old_rows
              WHERE status <> 'CLOSED' GROUP BY 1, 2 ORDER BY 1, 2 LOOP
      UPDATE activity_skus SET sold = sold - d.q
       WHERE activity_id = d.activity_id AND sku_id = d.sku_id;
    END LOOP;
  ELSE
    FOR d IN SELECT activity_id, sku_id, sum(q)::int AS q FROM (
               SELECT activity_id, sku_id, quantity AS q FROM new_rows WHERE status <> 'CLOSED'
               UNION ALL
               SELECT activity_id, sku_id, -quantity FROM old_rows WHERE status <> 'CLOSED') x
              GROUP BY 1, 2 HAVING sum(q) <> 0 ORDER BY 1, 2 LOOP
      UPDATE activity_skus SET sold = sold + d.q
       WHERE activity_id = d.activity_id AND sku_id = d.sku_id;
    END LOOP;
  END IF;
  RETURN NULL;
END
$fn$;
CREATE TRIGGER orders_sold_insert AFTER INSERT ON orders REFERENCING NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION activity_skus_track_sold();
CREATE TRIGGER orders_sold_update AFTER UPDATE ON orders REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION activity_skus_track_sold();
CREATE TRIGGER orders_sold_delete AFTER DELETE ON orders REFERENCING OLD TABLE AS old_rows
  FOR EACH STATEMENT EXECUTE FUNCTION activity_skus_track_sold();
-- (The guard sums a buyer's live quantity per SKU through orders_live_buyer_slot's prefix.)
`,
  },
];

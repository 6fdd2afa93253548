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
];

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
    version: 3,
    name: 'activity-registry',
    sql: `
-- The activities the operator knows, with their sale window: lets the platform-level after-sale
-- role answer a submission once the cache is gone (ENDED after endAt, NOT_STARTED before startAt,
-- NOT_FOUND for an id nobody registered). owner_uid keeps a second resource that reuses an
-- activity id from moving the first one's window.
CREATE TABLE activity_registry (
  activity_id    text        PRIMARY KEY,
  owner          text        NOT NULL,
  owner_uid      text        NOT NULL,
  start_at       timestamptz NOT NULL,
  end_at         timestamptz NOT NULL CHECK (end_at > start_at),
  registered_at  timestamptz NOT NULL DEFAULT now(),
  updated_at     timestamptz NOT NULL DEFAULT now()
);
-- The after-sale sweeper looks for activities with closed orders whose stock is not settled; the
-- existing index orders_closed_stock_pending serves it, and orders_unpaid_expiry the unpaid ones.
`,
  },
  {
    version: 4,
    name: 'refunds-order-events',
    sql: `
-- Refunds (docs/after-sale.md "Refunds"). A surplus payment (REFUND_PENDING: duplicate trade, wrong
-- amount, paid after close) goes REFUND_PENDING -> REFUNDING -> REFUNDED; a refunded order's
-- applied payment stays APPLIED (it was applied; the order's own status says it is refunded).
ALTER TABLE payments DROP CONSTRAINT payments_state_check;
ALTER TABLE payments ADD CONSTRAINT payments_state_check
  CHECK (state IN ('RECEIVED', 'APPLIED', 'REFUND_PENDING', 'REFUNDING', 'REFUNDED'));
ALTER TABLE payments DROP CONSTRAINT payments_check;
ALTER TABLE payments ADD CONSTRAINT payments_refund_reason_check
  CHECK ((state IN ('REFUND_PENDING', 'REFUNDING', 'REFUNDED')) = (refund_reason IS NOT NULL));

-- One row per refund of one payment. refund_id is the refund request id sent to the provider: it is
-- committed here BEFORE the provider is called, so every retry (after a timeout, a 5xx or a SIGKILL
-- between the provider's answer and our write) sends the same id and the provider refunds once.
CREATE TABLE refunds (
  refund_id          text          PRIMARY KEY CHECK (refund_id ~ '^rf-[0-9a-f]{32}$'),
  provider           text          NOT NULL,
  trade_no           text          NOT NULL,
  order_id           bigint        NOT NULL REFERENCES orders (id),
  activity_id        text          NOT NULL,
  amount             numeric(16,2) NOT NULL CHECK (amount > 0),
  -- ORDER: the refund of a paid order (order PAID -> REFUNDING -> REFUNDED);
  -- PAYMENT: the refund of a surplus payment (payment REFUND_PENDING -> REFUNDING -> REFUNDED).
  kind               text          NOT NULL CHECK (kind IN ('ORDER', 'PAYMENT')),
  reason             text          NOT NULL,
  requested_by       text          NOT NULL,
  state              text          NOT NULL CHECK (state IN ('PENDING', 'SUCCEEDED', 'FAILED')),
  attempts           integer       NOT NULL DEFAULT 0,
  next_attempt_at    timestamptz   NOT NULL DEFAULT now(),
  provider_status    text,
  provider_refund_no text,
  last_error         text,
  trace_id           text          NOT NULL DEFAULT '',
  created_at         timestamptz   NOT NULL DEFAULT now(),
  updated_at         timestamptz   NOT NULL DEFAULT now(),
  completed_at       timestamptz,
  -- Full refunds only: a payment is refunded at most once.
  UNIQUE (provider, trade_no)
);
CREATE INDEX refunds_due ON refunds (next_attempt_at) WHERE state = 'PENDING';
CREATE INDEX refunds_order ON refunds (order_id);
CREATE INDEX refunds_activity_state ON refunds (activity_id, state);

-- Order events (docs/order-events.md): the transactional outbox. Every change of orders.status
-- (and every insert) writes one row IN THE SAME TRANSACTION, by the triggers below, so no code
-- path (consumer insert, transitionOrder, the sweeper's batch close, in-flight CLOSED insert, and
-- any added later) can change an order without its event. orders.event_seq numbers the changes
-- of one order (1 = the insert): the event id is "<order id>-<seq>".
ALTER TABLE orders ADD COLUMN event_seq integer NOT NULL DEFAULT 1;

CREATE TABLE order_events (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  order_id     bigint      NOT NULL,
  seq          integer     NOT NULL,
  activity_id  text        NOT NULL,
  from_status  text,
  to_status    text        NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT now(),
  -- Set in the relay's transaction once Kafka acknowledged the event; never a cursor over id
  -- (ids are allocated before commit, so a cursor would skip rows committed late).
  published_at timestamptz,
  UNIQUE (order_id, seq)
);
-- The rows stay narrow (no payload): the relay builds the message from the row and the order's
-- immutable columns (order-events-store.ts), so the consumer's batch insert pays one narrow
-- INSERT ... SELECT per batch, not a JSON document per order.
CREATE INDEX order_events_unpublished ON order_events (id) WHERE published_at IS NULL;
CREATE INDEX order_events_unpublished_order ON order_events (order_id, seq) WHERE published_at IS NULL;
CREATE INDEX order_events_published ON order_events (published_at) WHERE published_at IS NOT NULL;

CREATE FUNCTION orders_bump_event_seq() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  NEW.event_seq := OLD.event_seq + 1;
  RETURN NEW;
END $fn$;
CREATE TRIGGER orders_event_seq BEFORE UPDATE OF status ON orders
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION orders_bump_event_seq();

-- Statement-level with transition tables: one INSERT per batch of the consumer, not one per row.
CREATE FUNCTION orders_events_on_insert() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO order_events (order_id, seq, activity_id, from_status, to_status)
  SELECT n.id, n.event_seq, n.activity_id, NULL, n.status FROM new_orders n ORDER BY n.id;
  RETURN NULL;
END $fn$;
CREATE TRIGGER orders_events_insert AFTER INSERT ON orders
  REFERENCING NEW TABLE AS new_orders FOR EACH STATEMENT EXECUTE FUNCTION orders_events_on_insert();

CREATE FUNCTION orders_events_on_update() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  INSERT INTO order_events (order_id, seq, activity_id, from_status, to_status)
  SELECT n.id, n.event_seq, n.activity_id, o.status, n.status
    FROM new_orders n JOIN old_orders o ON o.id = n.id
   WHERE o.status IS DISTINCT FROM n.status ORDER BY n.id;
  RETURN NULL;
END $fn$;
CREATE TRIGGER orders_events_update AFTER UPDATE ON orders
  REFERENCING OLD TABLE AS old_orders NEW TABLE AS new_orders
  FOR EACH STATEMENT EXECUTE FUNCTION orders_events_on_update();
`,
  },
  {
    version: 5,
    name: 'tenant-isolation',
    sql: `
-- Activity id claims: the first FlashSaleActivity to claim an id owns it for good (the id's Redis
-- keys, Kafka topics and PostgreSQL rows); another resource naming the same id is refused with
-- ActivityIdInUse and touches nothing (docs/operator.md, "Activity ids"). Never deleted: an id
-- is used once, like its write-back fence. Kafka treats '.' and '_' in topic names alike, so
-- topic_key (the id with '_' read as '.') is unique too: two ids that would share a topic's
-- metrics cannot both be claimed.
CREATE TABLE activity_claims (
  activity_id    text        PRIMARY KEY,
  topic_key      text        NOT NULL UNIQUE,
  owner_uid      text        NOT NULL,
  owner_namespace text       NOT NULL,
  owner_name     text        NOT NULL,
  claimed_at     timestamptz NOT NULL DEFAULT now()
);

-- catalogRef reads the catalog of the activity's own namespace only. Rows written before this
-- migration belong to no namespace ('') until the platform team assigns them (docs/install.md).
ALTER TABLE catalog_items ADD COLUMN namespace text NOT NULL DEFAULT '';
ALTER TABLE catalog_items DROP CONSTRAINT catalog_items_pkey;
ALTER TABLE catalog_items ADD PRIMARY KEY (namespace, catalog, sku_id);

-- The runtime's database role: data only (SELECT, INSERT, UPDATE, DELETE), no DDL. The migration
-- (owner) account creates it without LOGIN; a login user of the runtime is made a member of it
-- (docs/install.md, "Database accounts"). Default privileges give it the tables of later
-- migrations too. A migrator that may not create roles leaves this to the DBA (NOTICE).
DO $roles$
BEGIN
  BEGIN
    CREATE ROLE flashsale_runtime NOLOGIN;
  EXCEPTION
    WHEN duplicate_object OR unique_violation THEN NULL;
    WHEN insufficient_privilege THEN
      RAISE NOTICE 'cannot create role flashsale_runtime: create it (NOLOGIN) and migrate again';
  END;
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'flashsale_runtime') THEN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO flashsale_runtime', current_schema());
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I TO flashsale_runtime',
                   current_schema());
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA %I TO flashsale_runtime', current_schema());
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO flashsale_runtime',
                   current_schema());
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I GRANT USAGE, SELECT ON SEQUENCES TO flashsale_runtime',
                   current_schema());
    -- The migrations' own bookkeeping is the owner's business.
    EXECUTE 'REVOKE INSERT, UPDATE, DELETE ON schema_migrations FROM flashsale_runtime';
  END IF;
END
$roles$;
`,
  },
  {
    version: 6,
    name: 'activity-items',
    sql: `
-- The items of each activity as the operator loaded them into the cache (newest generation wins):
-- the consumer checks every order message against them (price, quantity and slot within the
-- limit per buyer) instead of trusting what arrives on Kafka.
CREATE TABLE activity_items (
  activity_id    text          NOT NULL,
  sku_id         text          NOT NULL,
  name           text          NOT NULL,
  price          numeric(14,2) NOT NULL CHECK (price >= 0),
  limit_per_user integer       NOT NULL CHECK (limit_per_user >= 1),
  generation     bigint        NOT NULL,
  updated_at     timestamptz   NOT NULL DEFAULT now(),
  PRIMARY KEY (activity_id, sku_id)
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
  {
    version: 8,
    name: 'cache-restores',
    sql: `
-- A Redis that came back empty or behind mid-sale is restored from PostgreSQL by the operator
-- (operator/reconcile/restore-cache.ts, docs/faults.md window 13). One row per restore: its epoch
-- (the mark written into the cache's meta hash when the reload is done), what was found, and the
-- step reached. The step only moves forward through conditional updates, so an operator killed at
-- any line resumes the same restore, and a second operator cannot start another one for the same
-- activity while it is open (the partial unique index).
CREATE TABLE cache_restores (
  activity_id  text        NOT NULL,
  epoch        integer     NOT NULL CHECK (epoch >= 1),
  reason       text        NOT NULL CHECK (reason IN ('CacheEmpty', 'CacheBehind')),
  step         text        NOT NULL DEFAULT 'detected'
                 CHECK (step IN ('detected', 'paused', 'drained', 'reloaded', 'resumed')),
  divergence   jsonb       NOT NULL DEFAULT '{}'::jsonb,
  reloaded     jsonb       NOT NULL DEFAULT '{}'::jsonb,
  detected_at  timestamptz NOT NULL DEFAULT now(),
  paused_at    timestamptz,
  drained_at   timestamptz,
  reloaded_at  timestamptz,
  resumed_at   timestamptz,
  PRIMARY KEY (activity_id, epoch)
);
CREATE UNIQUE INDEX cache_restores_one_open ON cache_restores (activity_id) WHERE step <> 'resumed';
`,
  },
  {
    version: 9,
    name: 'order-events-per-activity',
    sql: `
-- The order-event relay of one activity reads the head of its own queue
-- (core/db/order-events-store.ts claimPublishableEvents). With only order_events_unpublished (id)
-- it walked past every other activity's unpublished events on each poll: 75 ms per poll behind
-- 500,000 of another activity's, a core of PostgreSQL while they waited (docs/benchmarks.md,
-- "Order events after a burst"). order_events is purged after ORDER_EVENTS_RETENTION_HOURS, so the
-- index is built over a bounded table.
CREATE INDEX order_events_unpublished_activity ON order_events (activity_id, id) WHERE published_at IS NULL;
`,
  },
  {
    version: 10,
    name: 'stock-withheld',
    sql: `
-- 'withheld': an order the stock guard closed keeps its unit out of the sale, in Redis and in
-- activity_stock alike (core/order-lifecycle.ts guardRelease). stock_returned stays false for it.
-- NOT VALID: every existing row passed the narrower check it replaces, so the upgrade does not
-- scan orders under the migration's lock; new and updated rows are checked as before.
ALTER TABLE orders DROP CONSTRAINT orders_stock_return_via_check;
ALTER TABLE orders ADD CONSTRAINT orders_stock_return_via_check
  CHECK (stock_return_via IN ('redis', 'postgres', 'unresolved', 'withheld')) NOT VALID;
`,
  },
  {
    version: 11,
    name: 'write-back-trimmed',
    sql: `
-- Units the write-back did not take from Redis' remaining stock because PostgreSQL had sold them
-- already (core/db/stock-store.ts writeBack): Redis forgot reservations and counted their units
-- again. 0 for every write-back before this column.
ALTER TABLE activity_writebacks ADD COLUMN trimmed_total bigint NOT NULL DEFAULT 0;
`,
  },
  {
    version: 12,
    name: 'order-events-unused-index',
    sql: `
-- No query reads order_events_unpublished_order since the relay's claim decides which events are
-- their order's oldest from the head of the queue (core/db/order-events-store.ts
-- claimPublishableEvents): every order's insert and status change still paid an entry in it.
-- (order_id, seq) stays unique (the table's own key), which serves an order's events.
DROP INDEX IF EXISTS order_events_unpublished_order;
`,
  },
  {
    version: 13,
    name: 'withheld-returned',
    sql: `
-- An order the guard closed withholds its unit in place of an order whose reservation Redis
-- forgot; once that order is closed too, the unit goes back to the sale (core/order-lifecycle.ts
-- settleForgotten) and the closed order records for which order. stock_return_via stays
-- 'withheld': where the unit went when this order was settled. The index serves the lookups of a
-- buyer's (activity, sku, buyer) and of a SKU's (activity, sku) stand-ins.
ALTER TABLE orders ADD COLUMN withheld_returned_for bigint;
CREATE INDEX orders_withheld_unreturned ON orders (activity_id, sku_id, user_id)
  WHERE close_reason IN ('OVERSELL_PREVENTED', 'BUYER_LIMIT_EXCEEDED', 'GAP_COMPENSATED')
    AND withheld_returned_for IS NULL;
`,
  },
  {
    version: 14,
    name: 'registry-loaded-settings',
    sql: `
-- The order-code requirement and reopen-on-release of the generation loaded, recorded with its
-- sale window after every load: a cache restore puts back what was loaded, never a spec edit the
-- operator refused (operator/reconcile/restore-cache.ts). NULL: registered before this migration.
ALTER TABLE activity_registry ADD COLUMN require_order_code boolean, ADD COLUMN reopen_on_release boolean;
`,
  },
  {
    version: 15,
    name: 'activity-registrations',
    sql: `
-- Pre-registrations (spec.eligibility.preRegistration), written by the api's registration route
-- before the buyer's Redis flags (core/db/registrations-store.ts): the truth a cache restore
-- re-flags the buyers from (core/cache-restore.ts), since registration closes at startAt and a
-- buyer cannot register again. One row per buyer and activity; a repeat changes nothing.
CREATE TABLE activity_registrations (
  activity_id   text        NOT NULL,
  user_id       text        NOT NULL,
  registered_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (activity_id, user_id)
);
`,
  },
  {
    version: 16,
    name: 'unit-held-for-payment',
    sql: `
-- A closed order whose reservation Redis held PAID when the write-back took its snapshot: a payment
-- in time took the unit back (reclaimPaid-5.lua) and its transaction died before the commit. The
-- snapshot counted the unit held, so activity_stock does not have it; the provider's retry reopens
-- the order without taking a second unit (core/order-lifecycle.ts reclaimClosedOrder). Set by the
-- write-back's transaction (core/db/stock-store.ts writeBack) with stock_return_via 'unresolved'
-- (neither returned nor sold until the payment comes); cleared when the order is reopened.
ALTER TABLE orders ADD COLUMN unit_held_for_payment boolean NOT NULL DEFAULT false;
`,
  },
  {
    version: 17,
    name: 'journal-cancel-markers',
    sql: `
-- The buyers' cancellations recorded before their submissions reached the cache, which a cache
-- restore puts back as cancel markers (core/db/journal-store.ts cancellationsBeforeReservation):
-- found without reading the activity's whole journal.
CREATE INDEX order_journal_cancelled_before_reservation ON order_journal (activity_id, id)
  WHERE event = 'CANCELLED_BEFORE_RESERVATION';
`,
  },
];

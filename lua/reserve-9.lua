--[[
  Reserves stock for one buyer in one atomic step, and appends the outbox entry (the half
  message) in the same step: there is no instant in which stock is gone and no outbox entry
  exists.

  Every key is of one reservation scope (core/keys.ts): the activity's own, or, for a SKU split
  into stock buckets, the buyer's home bucket of that SKU (its own hash tag, its own outbox).

  Input:
    KEYS[1] meta hash            (gate, startMs, endMs, requireCode)
    KEYS[2] sku hash             (stock, limit, price, name)
    KEYS[3] buyer hash           (<sku>:qty, <sku>:slot:<n>)
    KEYS[4] reservation hash     (the ledger entry; its existence makes the call a replay)
    KEYS[5] outbox stream        (rid, m = the order message as JSON, key = buyer id, trace)
    KEYS[6] ledger sorted set    (reservations not yet confirmed as orders)
    KEYS[7] counters hash
    KEYS[8] order code key       (or the activity's placeholder key when no code was sent)
    KEYS[9] the buyer's rate-limit counter (core/keys.ts rateLimitKey('buyer', <buyer>)), or the
            scope's placeholder key when ARGV[9] is 0

    ARGV[1] reservation id (derived from activity, buyer and requestId by the caller)
    ARGV[2] buyer id
    ARGV[3] sku id
    ARGV[4] quantity (integer >= 1)
    ARGV[5] requestId
    ARGV[6] trace id
    ARGV[7] order code ('' when none)
    ARGV[8] activity id
    ARGV[9] the buyer's requests per rate-limit window (0: not counted here: shaping off, no
            per-buyer limit, or a bucket scope, whose caller counts in countWindow-1.lua)
    ARGV[10] the window's seconds
    ARGV[11] '1' when this buyer's cancel marker holds the id in the activity's scope (a bucket
             reservation whose claim, claimRequest-2.lua, answered 2): an earlier reservation
             under the id is still replayed, nothing new is reserved (-8 CANCELLED), so the
             marker cancels the submission in every scope however many of them the
             cancellation reached; '2' when the claim could not be written (it answered 3: the
             activity's Redis at its maxmemory): every answer that writes nothing is given as
             usual (a replay, the gate's, the eligibility's, LIMIT_REACHED, SOLD_OUT), and
             where a reservation would be made, none is ({3}); '' or absent otherwise

  Output:
     {1, reservationId, stockLeft, consumed, ttlMs}
                                              reserved now; consumed = points of the buyer's
                                              window, this one included, ttlMs = the window's
                                              rest (both 0 when not counted here)
     {2, reservationId, state}                replay of an earlier call with this requestId
     {3}                                      ARGV[11] '2': a reservation would be made, but the
                                              submission holds no claim; nothing written
    -1  NOT_STARTED  gate pending or before startAt
    -2  ENDED        gate closed/frozen or at/after endAt
    -3  PAUSED
    -4  SOLD_OUT     (second element: stock left)
    -5  LIMIT_REACHED
    -6  UNKNOWN_SKU
    -7  INVALID_ORDER_CODE
    -8  CANCELLED    the reservation was cancelled before it arrived
    -9  NOT_LOADED   the activity is not in the cache
    -10 IDEMPOTENCY_CONFLICT  the requestId was used for a different sku or quantity
    -14 MISMATCH     a reservation of another buyer holds this id (cannot happen with derived ids)
    -20 BUCKETED     the SKU's stock lives in buckets (its activity-scope hash has 'buckets'):
                     the caller re-reads the bucket layout and calls the buyer's home bucket;
                     {-20, consumed, ttlMs}: the point this call counted, which the call in the
                     bucket does not count again
    -40 BUYER_DENIED    the buyer is on the activity's deny list (buyer hash field '~deny')
    -41 NOT_REGISTERED  the activity requires pre-registration (meta 'requireReg' = '1') and the
                        buyer hash has no '~reg' field
    -43 RATE_LIMITED {-43, ttlMs}: the buyer's window is used up (this submission counted all the
                     same, as rate-limiter-flexible counts)

  Order of the checks (ARCHITECTURE.md "One Redis call per submission"): a replay first, answered
  without counting (it is a read of the buyer's own reservation, like a poll, and a retry after a
  lost answer must not cost the buyer their window); then the rate limit, before every other
  refusal (a submission under an id that was cancelled, or reserved another SKU or quantity, is
  no replay: it counts, then is refused), so that every new submission counts whatever it is answered (not started, sold out,
  limit reached) as it did when the limiter was a call of its own: a bot hammering a closed gate or
  a sold-out SKU spends its window and cannot keep a budget for the opening or a restock. The
  counter and the reservation are one atomic step: no point is counted for a reservation that
  failed half-way, and no reservation is made past the limit.

  A cancel marker (cancelBeforeReserve-3.lua) refuses only its own buyer's submission: one left
  under this id by another buyer (possible only with markers written before markers were bound to
  their owner) is not this buyer's cancellation and is removed.
]]
local rid, user, sku, qty = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])

--- @include "includes/nowMs"
--- @include "includes/gateRefusal"
--- @include "includes/buyerWindow"

local prior = redis.call('HMGET', KEYS[4], 'state', 'sku', 'qty', 'user')
if prior[1] and prior[4] ~= user then
  if prior[1] ~= 'CANCELLED' then return {-14, rid} end
  redis.call('DEL', KEYS[4])
  prior = {false}
end
-- Only a true replay is free; a submission the id's record refuses (cancelled before it arrived,
-- or the id used for another SKU or quantity) counts like any other refusal, after the window.
local refusedById = nil
if prior[1] then
  if prior[1] == 'CANCELLED' then refusedById = -8
  elseif prior[2] ~= sku or tonumber(prior[3]) ~= qty then refusedById = -10
  else return {2, rid, prior[1]} end
elseif ARGV[11] == '1' then refusedById = -8 end

-- Rate limit (docs/operator.md "Traffic shaping and eligibility").
local requests, consumed, windowMs = tonumber(ARGV[9]), 0, 0
if requests > 0 then
  consumed, windowMs = countWindow(9, tonumber(ARGV[10]))
  if consumed > requests then return {-43, windowMs} end
end
-- End of rate limit.
if refusedById then return {refusedById, rid} end

local now = nowMs()
local meta = redis.call('HMGET', KEYS[1], 'gate', 'startMs', 'endMs', 'requireCode', 'cleanupBegan')
-- A cleanup has begun (core/activity-cache.ts cleanupActivity): this id's reservation may be
-- deleted already, so the cache can no longer tell a retry from a new submission. Answered as
-- not loaded: the caller asks PostgreSQL, which holds every order of the sale by then.
if meta[5] then return {-9} end
local refusal = gateRefusal(meta[1], meta[2], meta[3], now)
if refusal then return {refusal} end

-- Eligibility (docs/operator.md "Traffic shaping and eligibility"): the flags live in the
-- buyer's own hash and the meta hash, so the check is atomic with the reservation at no extra key.
-- A replay (above) still answers: the buyer reserved before being listed.
local elig = redis.call('HMGET', KEYS[3], '~deny', '~reg')
if elig[1] then return {-40} end
if not elig[2] and redis.call('HGET', KEYS[1], 'requireReg') == '1' then return {-41} end
-- End of eligibility.

local item = redis.call('HMGET', KEYS[2], 'stock', 'limit', 'price', 'name', 'buckets')
if not item[1] then return {-6} end
if item[5] then return {-20, consumed, windowMs} end
local stock, limit = tonumber(item[1]), tonumber(item[2])

if meta[4] == '1' then
  if ARGV[7] == '' or redis.call('GET', KEYS[8]) ~= (user .. '|' .. sku) then return {-7} end
end

local held = tonumber(redis.call('HGET', KEYS[3], sku .. ':qty') or '0')
if held + qty > limit then return {-5} end
-- A slot per live reservation: PostgreSQL's unique (activity, buyer, sku, slot) key repeats
-- this limit, so a duplicate can never become a second order even if Redis state were lost.
local slot = nil
for i = 1, limit do
  if redis.call('HEXISTS', KEYS[3], sku .. ':slot:' .. i) == 0 then slot = i; break end
end
if not slot then return {-5} end

if stock < qty then return {-4, stock} end
-- Without its claim the id could reserve in another scope too: answer, never reserve.
if ARGV[11] == '2' then return {3} end

local left = redis.call('HINCRBY', KEYS[2], 'stock', -qty)
redis.call('HINCRBY', KEYS[3], sku .. ':qty', qty)
redis.call('HSET', KEYS[3], sku .. ':slot:' .. slot, rid)
redis.call('HSET', KEYS[4], 'state', 'RESERVED', 'user', user, 'sku', sku, 'qty', qty,
  'slot', slot, 'price', item[3], 'name', item[4], 'ts', now, 'trace', ARGV[6], 'req', ARGV[5])
-- The message's fields and the hash's are core/order-message.ts's; 'key' and 'trace' repeat the
-- Kafka key and header so that the relay forwards the entry without parsing 'm'.
redis.call('XADD', KEYS[5], '*', 'rid', rid, 'm', cjson.encode({
  reservationId = rid, activityId = ARGV[8], userId = user, skuId = sku, quantity = qty,
  slot = slot, unitPrice = item[3], itemName = item[4], reservedAt = now,
  traceId = ARGV[6], requestId = ARGV[5]
}), 'key', user, 'trace', ARGV[6])
redis.call('ZADD', KEYS[6], now, rid)
redis.call('HINCRBY', KEYS[7], 'reserved', qty)
redis.call('HINCRBY', KEYS[7], 'reservations', 1)
if meta[4] == '1' then redis.call('DEL', KEYS[8]) end
return {1, rid, left, consumed, windowMs}

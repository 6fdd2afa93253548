--[[
  Idempotent compensation keyed by reservation id: returns the reservation's stock at most once.
  It never creates a key: releasing an id with no reservation is UNKNOWN_RESERVATION (a
  cancellation that arrives before its reservation goes through cancelBeforeReserve-3.lua).

  An order the PostgreSQL stock guard closed (core/stock-guard.ts) withholds its unit (ARGV[6]
  '0'): the unit was one Redis counted beyond PostgreSQL's stock or the buyer's limit (a failover
  lost the reservations that had taken it), so returning it would only sell it again to be closed
  again. Withheld, the stock stays taken and the counters stay as they are (initial - stock =
  reserved - released still holds); the reservation is RELEASED all the same, with the quantity it
  withheld recorded (`withheld`), which returnWithheld-6.lua gives back once the forgotten order
  it stood in for is closed.

  Input:
    KEYS[1] meta hash
    KEYS[2] reservation hash
    KEYS[3] sku hash
    KEYS[4] buyer hash
    KEYS[5] ledger sorted set
    KEYS[6] counters hash

    ARGV[1] reservation id
    ARGV[2] buyer id     (must match the reservation)
    ARGV[3] sku id       (must match the reservation)
    ARGV[4] reason       (CANCELLED | PAYMENT_TIMEOUT | COMPENSATED | ...)
    ARGV[5] restock pub/sub channel
    ARGV[6] '1' returns the stock, '0' withholds it
    ARGV[7] '1' frees the buyer's slot (when the sale reopens on release), '0' keeps it

  Output:
     {1, stockAfter}   released now (stockAfter unchanged when withheld)
     {2}               already released earlier, or cancelled before it arrived (nothing changed)
    -11 FROZEN         stock was written back: release through PostgreSQL instead
    -12 UNKNOWN_RESERVATION
    -13 ALREADY_PAID
    -14 MISMATCH       buyer or sku differ from the reservation
]]
--- @include "includes/settledReservation"
if r[2] ~= user then return {-14} end
-- A cancel marker (cancelBeforeReserve-3.lua) has no sku and holds no stock.
if state == 'CANCELLED' and not r[3] then return {2} end
if r[3] ~= sku then return {-14} end
if state == 'RELEASED' or state == 'CANCELLED' then return {2} end
if state == 'PAID' then return {-13} end

local qty = tonumber(r[4])
local restock = ARGV[6] ~= '0'
local after
if restock then
  after = redis.call('HINCRBY', KEYS[3], 'stock', qty)
else
  after = tonumber(redis.call('HGET', KEYS[3], 'stock') or '0')
end
if ARGV[7] ~= '0' and redis.call('HGET', KEYS[1], 'reopen') ~= '0' then
  redis.call('HINCRBY', KEYS[4], sku .. ':qty', -qty)
  redis.call('HDEL', KEYS[4], sku .. ':slot:' .. r[5])
end
redis.call('ZREM', KEYS[5], rid)
redis.call('HSET', KEYS[2], 'state', 'RELEASED', 'releasedAt', nowMs(), 'reason', ARGV[4])
if not restock then redis.call('HSET', KEYS[2], 'withheld', qty) end
if restock then
  redis.call('HINCRBY', KEYS[6], 'released', qty)
  redis.call('PUBLISH', ARGV[5], sku)
end
return {1, after}

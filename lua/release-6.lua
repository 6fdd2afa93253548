--[[
  Idempotent compensation keyed by reservation id: returns the reservation's stock at most once.
  It never creates a key: releasing an id with no reservation is UNKNOWN_RESERVATION (a
  cancellation that arrives before its reservation goes through cancelBeforeReserve-3.lua).

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

  Output:
     {1, stockAfter}   released now
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
local after = redis.call('HINCRBY', KEYS[3], 'stock', qty)
if redis.call('HGET', KEYS[1], 'reopen') ~= '0' then
  redis.call('HINCRBY', KEYS[4], sku .. ':qty', -qty)
  redis.call('HDEL', KEYS[4], sku .. ':slot:' .. r[5])
end
redis.call('ZREM', KEYS[5], rid)
redis.call('HSET', KEYS[2], 'state', 'RELEASED', 'releasedAt', nowMs(), 'reason', ARGV[4])
redis.call('HINCRBY', KEYS[6], 'released', qty)
redis.call('PUBLISH', ARGV[5], sku)
return {1, after}

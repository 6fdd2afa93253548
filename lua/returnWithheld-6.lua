--[[
  Gives back, once, the unit a guard-closed reservation withheld (release-6.lua with ARGV[6] '0').

  A reservation the PostgreSQL guard closed for the buyer's limit (BUYER_LIMIT_EXCEEDED,
  GAP_COMPENSATED) took the unit of a reservation of the same buyer that Redis had forgotten (a
  failover, a restart without data) while its order stayed live in PostgreSQL. When that forgotten
  order is closed too (payment timeout, cancellation), its own release finds nothing in Redis, and
  the unit the withheld reservation holds is the one PostgreSQL now frees: it goes back to the sale
  here, with the buyer's slot (core/order-lifecycle.ts, settleForgotten). The order it is given
  back for is recorded, so a repeat (a retry after a crash before PostgreSQL recorded it) changes
  nothing and says for which order it was given.

  Input:
    KEYS[1] meta hash
    KEYS[2] reservation hash (the withheld one)
    KEYS[3] sku hash
    KEYS[4] buyer hash
    KEYS[5] ledger sorted set (unused; the same keys as release-6.lua)
    KEYS[6] counters hash

    ARGV[1] reservation id
    ARGV[2] buyer id     (must match the reservation)
    ARGV[3] sku id       (must match the reservation)
    ARGV[4] the closed order's id it is given back for
    ARGV[5] restock pub/sub channel

  Output:
     {1, stockAfter}   given back now
     {2, orderId}      given back earlier, for that order (nothing changed)
    -11 FROZEN         stock was written back: settle through PostgreSQL instead
    -12 UNKNOWN_RESERVATION
    -14 MISMATCH       buyer or sku differ from the reservation
    -21 NOT_WITHHELD   the reservation is not one released with its unit withheld
]]
--- @include "includes/settledReservation"
if r[2] ~= user or r[3] ~= sku then return {-14} end
local w = redis.call('HMGET', KEYS[2], 'withheld', 'withheldReturnedFor')
if w[2] then return {2, w[2]} end
if state ~= 'RELEASED' or not w[1] then return {-21} end

local qty = tonumber(w[1])
local after = redis.call('HINCRBY', KEYS[3], 'stock', qty)
local slotField = sku .. ':slot:' .. r[5]
-- The slot was kept while the forgotten order held it in PostgreSQL; it is freed as that order's
-- own release would have freed it (when the sale reopens on release), if it is still this one's.
if redis.call('HGET', KEYS[1], 'reopen') ~= '0' and redis.call('HGET', KEYS[4], slotField) == rid then
  redis.call('HINCRBY', KEYS[4], sku .. ':qty', -qty)
  redis.call('HDEL', KEYS[4], slotField)
end
redis.call('HSET', KEYS[2], 'withheldReturnedFor', ARGV[4], 'withheldReturnedAt', nowMs())
redis.call('HINCRBY', KEYS[6], 'released', qty)
redis.call('PUBLISH', ARGV[5], sku)
return {1, after}

--[[
  A payment made in time for an order the payment timeout closed (docs/after-sale.md "Late
  payment"): takes the reservation's unit back and marks it PAID, atomically, or changes nothing.
  Called inside the payment's PostgreSQL transaction (the order row locked); idempotent, so a
  retried notification after a failed commit finds the reservation PAID and goes on.

  Input:
    KEYS[1] meta hash
    KEYS[2] reservation hash
    KEYS[3] sku hash
    KEYS[4] buyer hash
    KEYS[5] counters hash

    ARGV[1] reservation id
    ARGV[2] buyer id     (must match the reservation)
    ARGV[3] sku id       (must match the reservation)

  Output:
     {1, stockAfter}   the released unit was taken back and the reservation is PAID
     {2}               already PAID (nothing changed)
     {3}               it was still RESERVED (never released): now PAID, no stock change
    -3  PAUSED         a cache restore holds the cache (the meta's `restoring` mark, set by
                       holdForRestore-1.lua until the reload's restoreStock/restoreBucket): the
                       reload rewrites stock absolutely, so nothing is taken back before it
    -4  SOLD_OUT       the released unit was sold again (second element: stock left)
    -5  LIMIT_REACHED  the buyer holds the slot (or the limit) with another reservation now
    -8  CANCELLED      a cancellation tombstone, not a reservation
    -11 FROZEN         stock was written back: take it back in PostgreSQL instead
    -12 UNKNOWN_RESERVATION
    -14 MISMATCH       buyer or sku differ from the reservation
]]
if redis.call('HEXISTS', KEYS[1], 'restoring') == 1 then return {-3} end
--- @include "includes/settledReservation"
if state == 'CANCELLED' then return {-8} end
if r[2] ~= user or r[3] ~= sku then return {-14} end
if state == 'PAID' then return {2} end
if state == 'RESERVED' then
  redis.call('HSET', KEYS[2], 'state', 'PAID')
  return {3}
end

-- RELEASED: the unit went back to the sale; take it back only if it is still there.
local qty = tonumber(r[4])
local stock = tonumber(redis.call('HGET', KEYS[3], 'stock') or '0')
if stock < qty then return {-4, stock} end
if redis.call('HGET', KEYS[1], 'reopen') ~= '0' then
  -- The release gave the buyer their slot back: it must still be free.
  local limit = tonumber(redis.call('HGET', KEYS[3], 'limit') or '0')
  local held = tonumber(redis.call('HGET', KEYS[4], sku .. ':qty') or '0')
  if held + qty > limit or redis.call('HEXISTS', KEYS[4], sku .. ':slot:' .. r[5]) == 1 then return {-5} end
  redis.call('HINCRBY', KEYS[4], sku .. ':qty', qty)
  redis.call('HSET', KEYS[4], sku .. ':slot:' .. r[5], rid)
end
local after = redis.call('HINCRBY', KEYS[3], 'stock', -qty)
redis.call('HINCRBY', KEYS[5], 'released', -qty)
redis.call('HSET', KEYS[2], 'state', 'PAID', 'reclaimedAt', nowMs())
return {1, after}

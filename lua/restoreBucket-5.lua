--[[
  Reload step of a cache restore for one stock bucket of a bucketed SKU (core/cache-restore.ts,
  ARCHITECTURE.md "Stock buckets"): writes the bucket as PostgreSQL proves it, absolutely. An
  earlier restore's epoch never overwrites a later one's mark on the bucket's meta; the same
  epoch's repeat writes again from its own snapshot (lua/restoreStock-var.lua says why). The bucket's stock is its share of the SKU's remaining units; its counters carry the
  reservations of the buyers whose home bucket it is, and the difference between the two as units
  moved by the restore (transferredIn / transferredOut), so the buckets' counters still sum to the
  SKU's remaining units (core/buckets.ts unitsLeft). Transfer records are dropped: the remaining
  units were counted from PostgreSQL, a donor record of the lost cache must not land again. The
  gate is not moved here (the restore's hold paused it; the resume moves every bucket's gate).

  Input:
    KEYS[1] the bucket's meta hash
    KEYS[2] the bucket's counters hash
    KEYS[3] the bucket's sku index set
    KEYS[4] the bucket's sku hash
    KEYS[5] the bucket's transfers hash

    ARGV[1]  restore epoch (integer >= 1)
    ARGV[2]  generation loaded (written as the bucket's `gen`)
    ARGV[3]  sku id
    ARGV[4]  the bucket's share of the SKU's initial stock
    ARGV[5]  limit per user
    ARGV[6]  unit price
    ARGV[7]  name
    ARGV[8]  the bucket's share of the SKU's remaining units (its stock)
    ARGV[9]  counters: reserved (quantity of the orders and in-flight reservations homed here)
    ARGV[10] counters: released (quantity of the closed orders homed here)
    ARGV[11] counters: reservations (orders + in-flight reservations homed here)

  Output:
     {1}                  written
     {2}                  a later epoch is already marked on the bucket: nothing written
    -16 BAD_ARGUMENT      malformed figures or epoch
]]
--- @include "includes/nowMs"

local epoch = tonumber(ARGV[1])
if not epoch or epoch < 1 or #ARGV ~= 11 then return {-16} end
if tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') > epoch then return {2} end
local initial, stock = tonumber(ARGV[4]), tonumber(ARGV[8])
local reserved, released = tonumber(ARGV[9]), tonumber(ARGV[10])
if not initial or not stock or not reserved or not released or not tonumber(ARGV[11])
  or stock < 0 or stock > initial or reserved < 0 or released < 0 then
  return {-16}
end

redis.call('HSET', KEYS[4], 'stock', stock, 'initial', initial, 'limit', ARGV[5], 'price', ARGV[6],
  'name', ARGV[7], 'gen', ARGV[2], 'repoch', epoch)
redis.call('SADD', KEYS[3], ARGV[3])
redis.call('DEL', KEYS[5])
-- Units the restore moved in or out of this bucket (never written as '-0', which HINCRBY refuses).
local moved = stock - (initial - reserved + released)
local movedIn, movedOut = 0, 0
if moved > 0 then movedIn = moved elseif moved < 0 then movedOut = -moved end
redis.call('HSET', KEYS[2], 'initial', initial, 'reserved', reserved, 'released', released,
  'reservations', ARGV[11], 'transferredIn', movedIn, 'transferredOut', movedOut)
redis.call('HSET', KEYS[1], 'gen', ARGV[2], 'epoch', epoch, 'restoredAt', nowMs())
redis.call('HSETNX', KEYS[1], 'loads', 1)
redis.call('HDEL', KEYS[1], 'restoring')
return {1}

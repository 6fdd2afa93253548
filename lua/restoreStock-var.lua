--[[
  Reload step of a cache restore (core/cache-restore.ts): writes each SKU's stock as PostgreSQL
  proves it (initial − live orders − reservations still in flight), absolutely. An earlier
  restore's epoch never overwrites a later one's mark; the same epoch's repeat (the operator died
  before recording the step, or Redis lost the reload) writes every SKU again from its own
  snapshot, the one its reservations are rewritten from: orders closed or paid between the two
  reads must move the stock too, or a unit is lost for good. Nothing else writes the stock
  meanwhile (the gate is paused since the hold; releases wait for the resume). The last chunk
  sets the counters and marks the cache with the epoch (`epoch`, `restoredAt`): from then on the
  cache is restored, and only then may the gate open again. The gate itself is not moved here.

  Input (numkeys given by the caller: 3 + number of SKUs in this chunk):
    KEYS[1]      meta hash
    KEYS[2]      counters hash
    KEYS[3]      sku index set
    KEYS[4..n]   one sku hash per SKU, in the order of the ARGV groups

    ARGV[1]  restore epoch (integer >= 1)
    ARGV[2]  generation loaded (written as the cache's `gen`)
    ARGV[3]  '1' when this is the last chunk, else '0'
    ARGV[4]  counters: initial (whole activity)
    ARGV[5]  counters: reserved (quantity of every order and in-flight reservation)
    ARGV[6]  counters: released (quantity of the closed orders)
    ARGV[7]  counters: reservations (orders + in-flight reservations)
    ARGV[8 + 6*(i-1) ..] per SKU i: sku id, initial, limit per user, unit price, name, remaining

  Output:
     {1, written, skipped}
     {2}                  a later epoch is already marked: nothing written
    -16 BAD_ARGUMENT      malformed group or epoch
]]
--- @include "includes/nowMs"

local epoch = tonumber(ARGV[1])
if not epoch or epoch < 1 then return {-16} end
if tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') > epoch then return {2} end
local n = #KEYS - 3
if #ARGV ~= 7 + 6 * n then return {-16} end

local written, skipped = 0, 0
local ids = {}
for i = 1, n do
  local base = 7 + 6 * (i - 1)
  local initial, remaining = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 6])
  if not initial or not remaining or remaining < 0 or remaining > initial then return {-16} end
  local key = KEYS[3 + i]
  if tonumber(redis.call('HGET', key, 'repoch') or '0') > epoch then
    skipped = skipped + 1
  else
    redis.call('HSET', key, 'stock', remaining, 'initial', initial, 'limit', ARGV[base + 3],
      'price', ARGV[base + 4], 'name', ARGV[base + 5], 'gen', ARGV[2], 'repoch', epoch)
    written = written + 1
  end
  ids[#ids + 1] = ARGV[base + 1]
end
if #ids > 0 then redis.call('SADD', KEYS[3], unpack(ids)) end

if ARGV[3] == '1' then
  redis.call('HSET', KEYS[2], 'initial', ARGV[4], 'reserved', ARGV[5], 'released', ARGV[6],
    'reservations', ARGV[7])
  redis.call('HSET', KEYS[1], 'gen', ARGV[2], 'epoch', epoch, 'restoredAt', nowMs())
  redis.call('HSETNX', KEYS[1], 'loads', 1)
  redis.call('HDEL', KEYS[1], 'restoring')
end
return {1, written, skipped}

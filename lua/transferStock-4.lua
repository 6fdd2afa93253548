--[[
  One side of a transfer of stock units between two buckets of a SKU (core/buckets.ts), keyed by
  a transfer id so that each side happens at most once: the donor's step takes the units and
  records `out:<id>` = "<units>|<recipient bucket>|<donor's restore epoch>", the recipient's step
  adds them and records `in:<id>` = "<units>|<donor bucket>". A donor record without its recipient
  record is a transfer in flight (completed by core/buckets.ts completeTransfers; counted as
  remaining by write-back).

  Fenced by cache restores (core/cache-restore.ts): a restore rewrites every bucket absolutely from
  PostgreSQL and drops their transfer records, so units taken before it must not land after it.
  The donor's step refuses while its bucket is held for a restore (gate `paused` or `restoring`
  set: the bucket may already be rewritten while the recipient is not yet, and would lose the
  units); the recipient's step is given the epoch the donor recorded and lands nothing when the
  recipient was rewritten by a later restore (the restore counted those units already).

  Input:
    KEYS[1] the bucket's meta hash    (gate: nothing moves once frozen)
    KEYS[2] the bucket's sku hash     (stock)
    KEYS[3] the bucket's transfers hash
    KEYS[4] the bucket's counters hash (transferredOut / transferredIn)

    ARGV[1] 'out' (donor side) | 'in' (recipient side)
    ARGV[2] transfer id
    ARGV[3] units: wanted (out: at most the bucket's stock is taken) or taken (in)
    ARGV[4] the other bucket's index
    ARGV[5] sku id
    ARGV[6] in: the donor's restore epoch from its record ('' for a record without one)

  Output:
     {1, units, epoch}   units taken (out) or added (in), now or by an earlier call with this
                         id; out: with the donor's restore epoch its record carries ('' when
                         an older record carries none)
     {0, 0}       in: superseded, the recipient was rebuilt by a restore after the donor's step
     -3 PAUSED        out: the bucket is held for a cache restore; nothing taken
     -9 NOT_LOADED    the bucket's meta hash is gone or its cleanup began; nothing written
    -11 FROZEN        stock was written back; nothing moves any more
    -16 BAD_ARGUMENT  unknown side or units
]]
local side, id, units = ARGV[1], ARGV[2], tonumber(ARGV[3])
if (side ~= 'out' and side ~= 'in') or not units or units < 0 then return {-16} end

local field = side .. ':' .. id
local done = redis.call('HGET', KEYS[3], field)
if done then
  local n, _, e = string.match(done, '^(%d+)|(%d+)|?(%d*)$')
  return {1, tonumber(n), e}
end
local meta = redis.call('HMGET', KEYS[1], 'gate', 'restoring', 'epoch', 'cleanupBegan')
if meta[1] == 'frozen' then return {-11} end
-- Cleaned up (or being cleaned up): a late step must never re-create a bucket's keys, which
-- nothing would delete again (the write-back counted units in flight as remaining already).
if not meta[1] or meta[4] then return {-9} end
local epoch = tonumber(meta[3] or '0')

if side == 'out' then
  if meta[1] == 'paused' or meta[2] then return {-3} end
  local stock = tonumber(redis.call('HGET', KEYS[2], 'stock') or '0')
  local take = math.min(units, stock)
  if take <= 0 then return {1, 0, tostring(epoch)} end
  redis.call('HINCRBY', KEYS[2], 'stock', -take)
  redis.call('HSET', KEYS[3], field, take .. '|' .. ARGV[4] .. '|' .. epoch)
  redis.call('HINCRBY', KEYS[4], 'transferredOut', take)
  return {1, take, tostring(epoch)}
end

local donorEpoch = tonumber(ARGV[6] or '')
if donorEpoch and epoch > donorEpoch then return {0, 0} end

redis.call('HINCRBY', KEYS[2], 'stock', units)
redis.call('HSET', KEYS[3], field, units .. '|' .. ARGV[4])
redis.call('HINCRBY', KEYS[4], 'transferredIn', units)
return {1, units}

--[[
  One side of a transfer of stock units between two buckets of a SKU (core/buckets.ts), keyed by
  a transfer id so that each side happens at most once: the donor's step takes the units and
  records `out:<id>` = "<units>|<recipient bucket>", the recipient's step adds them and records
  `in:<id>` = "<units>|<donor bucket>". A donor record without its recipient record is a transfer
  in flight (completed by core/buckets.ts completeTransfers; counted as remaining by write-back).

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

  Output:
     {1, units}   units taken (out) or added (in), now or by an earlier call with this id
    -11 FROZEN        stock was written back; nothing moves any more
    -16 BAD_ARGUMENT  unknown side or units
]]
local side, id, units = ARGV[1], ARGV[2], tonumber(ARGV[3])
if (side ~= 'out' and side ~= 'in') or not units or units < 0 then return {-16} end

local field = side .. ':' .. id
local done = redis.call('HGET', KEYS[3], field)
if done then return {1, tonumber(string.match(done, '^(%d+)'))} end
if redis.call('HGET', KEYS[1], 'gate') == 'frozen' then return {-11} end

if side == 'out' then
  local stock = tonumber(redis.call('HGET', KEYS[2], 'stock') or '0')
  local take = math.min(units, stock)
  if take <= 0 then return {1, 0} end
  redis.call('HINCRBY', KEYS[2], 'stock', -take)
  redis.call('HSET', KEYS[3], field, take .. '|' .. ARGV[4])
  redis.call('HINCRBY', KEYS[4], 'transferredOut', take)
  return {1, take}
end

redis.call('HINCRBY', KEYS[2], 'stock', units)
redis.call('HSET', KEYS[3], field, units .. '|' .. ARGV[4])
redis.call('HINCRBY', KEYS[4], 'transferredIn', units)
return {1, units}

--[[
  Issues a one-time order code: only inside the sale window (the gate open and the Redis clock
  between startAt and endAt), at most N codes per buyer per SKU over the whole sale.

  Input:
    KEYS[1] meta hash    (gate, startMs, endMs)
    KEYS[2] buyer hash   ('~codes:<sku>' counts the codes issued to this buyer for the sku)
    KEYS[3] order code key (new, random)

    ARGV[1] buyer id
    ARGV[2] sku id
    ARGV[3] ttl seconds (integer >= 1)
    ARGV[4] most codes per buyer per sku (0 = no limit)

  Output:
     {1, issuedSoFar}   the code is stored under KEYS[3] with the ttl
    -1  NOT_STARTED
    -2  ENDED
    -3  PAUSED
    -9  NOT_LOADED
    -42 ORDER_CODE_LIMIT  the buyer already obtained the most codes for this sku
]]
--- @include "includes/nowMs"
--- @include "includes/gateRefusal"

local meta = redis.call('HMGET', KEYS[1], 'gate', 'startMs', 'endMs')
local refusal = gateRefusal(meta[1], meta[2], meta[3], nowMs())
if refusal then return {refusal} end

local field = '~codes:' .. ARGV[2]
local max = tonumber(ARGV[4])
local issued = tonumber(redis.call('HGET', KEYS[2], field) or '0')
if max > 0 and issued >= max then return {-42} end

redis.call('SET', KEYS[3], ARGV[1] .. '|' .. ARGV[2], 'EX', tonumber(ARGV[3]), 'NX')
return {1, redis.call('HINCRBY', KEYS[2], field, 1)}

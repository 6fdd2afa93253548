--[[
  Marks a live reservation as paid so that no later release can return its stock.

  Input:
    KEYS[1] reservation hash
    KEYS[2] meta hash
    ARGV[1] reservation id

  Output:
     {1}  marked paid now
     {2}  already paid
    -11 FROZEN               written back: PostgreSQL holds the state now
    -12 UNKNOWN_RESERVATION
    -15 RELEASED             the reservation was released first
]]
if redis.call('HGET', KEYS[2], 'gate') == 'frozen' then return {-11} end
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {-12} end
if state == 'PAID' then return {2} end
if state ~= 'RESERVED' then return {-15} end
redis.call('HSET', KEYS[1], 'state', 'PAID')
return {1}

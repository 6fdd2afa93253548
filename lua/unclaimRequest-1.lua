--[[
  Takes back one attempt's claim of claimRequest-2.lua after its reservation was refused (nothing
  was reserved under the id by that attempt). A claim counts the attempts under it not refused yet
  (`attempts`: each claim adds one, each refusal here takes one away) and goes only when none is
  left: an attempt that reserved never comes here, so its claim stays whatever the attempts beside
  it do, in whichever order they end. A claim the cache restore wrote for a reservation it rebuilt
  (`held`) is never taken back.

  Input:
    KEYS[1] reservation hash of the activity's scope (the claim)

  Output:
    {1}  taken back
    {0}  kept (another attempt still under it, a restored claim, or not a claim)
]]
local claim = redis.call('HMGET', KEYS[1], 'state', 'held')
if claim[1] ~= 'ELSEWHERE' or claim[2] then return {0} end
if redis.call('HINCRBY', KEYS[1], 'attempts', -1) > 0 then return {0} end
redis.call('DEL', KEYS[1])
return {1}

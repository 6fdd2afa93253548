--[[
  Takes back a claim of claimRequest-2.lua after its reservation was refused (nothing was reserved
  under the id), unless another attempt claimed the id since: that one may have reserved.

  Input:
    KEYS[1] reservation hash of the activity's scope (the claim)
    ARGV[1] the refused attempt's number (claimRequest-2.lua's `attempt`)

  Output:
    {1}  taken back
    {0}  kept (a later attempt, or not a claim)
]]
local claim = redis.call('HMGET', KEYS[1], 'state', 'attempts')
if claim[1] ~= 'ELSEWHERE' or claim[2] ~= ARGV[1] then return {0} end
redis.call('DEL', KEYS[1])
return {1}

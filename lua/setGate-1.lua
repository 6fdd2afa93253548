--[[
  Moves the activity's gate. `frozen` is terminal: it is set before stock is written back to
  PostgreSQL, after which Redis stock never changes again.

  Input:
    KEYS[1] meta hash
    ARGV[1] new gate: pending | open | paused | closed | frozen

  Output:
     {1, previousGate}
    -9  NOT_LOADED   the activity is not in the cache
    -11 FROZEN       the gate is frozen and cannot move any more
    -16 BAD_ARGUMENT unknown gate
]]
local wanted = ARGV[1]
if wanted ~= 'pending' and wanted ~= 'open' and wanted ~= 'paused' and wanted ~= 'closed'
  and wanted ~= 'frozen' then return {-16} end
local current = redis.call('HGET', KEYS[1], 'gate')
if not current then return {-9} end
if current == 'frozen' and wanted ~= 'frozen' then return {-11} end
redis.call('HSET', KEYS[1], 'gate', wanted)
return {1, current}

--[[
  The reservations of one turn of the api's event loop in one scope (core/reservations.ts through
  core/script-batch.ts) in one call: reserve-9.lua's own text as a function's body, run for each
  of them in their order as their own calls would run one after another. Two submissions of one
  buyer count two points and hold two slots; a requestId sent twice in one turn is reserved by the
  first and replayed by the second.

  Input, per reservation i = 0..n-1 (all keys in one slot: one scope):
    KEYS[9i+1 .. 9i+9]    reserve-9.lua's KEYS[1..9]
    ARGV[1]               n
    ARGV[1+11i+1 .. +11]  reserve-9.lua's ARGV[1..11]

  Output: {0, reply 1, ..., reply n}, each reply the table reserve-9.lua returns for that
  reservation (its code first), or {'ERR', message} when that reservation's part raised an error:
  the message its own call's error reply would have begun with (a Redis error's own, OOM, READONLY,
  NOREPLICAS and WRONGTYPE included; 'ERR ' and the Lua error otherwise). That reservation fails
  as its own call would have, and the others are answered as usual. Redis refuses a write for
  the node's state (maxmemory, a replica, too few replicas, a failed save) only before a
  script's first write: a refused reservation wrote nothing, and a call that starts below
  maxmemory may write all its reservations past it, as one call writes all its own commands (at
  most core/reservations.ts RESERVATIONS_PER_CALL reservations).
]]
local function reserveOne(KEYS, ARGV)
--- @include "reserve-9"
end

local out = { 0 }
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  local keys, args = {}, {}
  for j = 1, 9 do keys[j] = KEYS[i * 9 + j] end
  for j = 1, 11 do args[j] = ARGV[1 + i * 11 + j] end
  local ok, reply = pcall(reserveOne, keys, args)
  if ok then
    out[#out + 1] = reply
  else
    -- redis.call's error arrives here as its message; an error raised as a table (writeUnlessFull)
    -- as the table; a Lua error as its text, which Redis would prefix with 'ERR '.
    local message = type(reply) == 'table' and reply.err or tostring(reply)
    if not string.match(message, '^%u+ ') then message = 'ERR ' .. message end
    out[#out + 1] = { 'ERR', message }
  end
end
return out

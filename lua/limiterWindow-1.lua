--[[
  The per-buyer window of the api's other limited routes (registrations, order codes), as
  rate-limiter-flexible's `customIncrTtlLuaScript` (runtime/api/rate-limit.ts redisLimiter): the
  same counter and the same rule as the reservation's scripts count in (includes/buyerWindow), so
  one window spans every limited route and a window eased mid-sale applies at once on all of them.

  Input (as the library calls its script):
    KEYS[1] the counter
    ARGV[1] points to count (negative: points given back, the library's reward)
    ARGV[2] window seconds (>= 1)

  Output:
    {consumed, ttlMs}   the points of this window and the milliseconds until it ends
    an OOM error        Redis is at its maxmemory: nothing counted, and the library falls back to
                        its in-memory insurance limiter (a point counted as 0 would let a flood
                        through the per-address limit while Redis is full)
]]
--- @include "includes/buyerWindow"

local consumed, ttl, full = countWindow(1, tonumber(ARGV[2]), tonumber(ARGV[1]))
if full then return redis.error_reply('OOM command not allowed when used memory > maxmemory') end
return {consumed, ttl}

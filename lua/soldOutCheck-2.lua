--[[
  The sold-out answer's one call (runtime/api/orders-routes.ts, after this process saw the SKU
  sold out): whether the submission is a replay, and otherwise its point in the buyer's
  rate-limit window. In the same order as reserve-9.lua: a replay first, free (it is answered
  with its reservation, like a poll); then the window, so a bot hammering a sold-out SKU spends
  its window as it would on the script and cannot keep its budget for a restock.

  Input:
    KEYS[1] reservation hash     (a reservation or a cancel marker under the derived id)
    KEYS[2] the buyer's counter  (core/keys.ts rateLimitKey('buyer', <buyer>); ignored when
                                  ARGV[1] is 0)
    ARGV[1] requests per window (0: no per-buyer limit)
    ARGV[2] window seconds

  Output:
    {2}                    a reservation or marker exists: the caller goes on to reserve-9.lua,
                           which replays it (no point counted here nor there) or, for a marker
                           or an id reserved for another SKU or quantity, counts the point there
                           and refuses
    {1, consumed, ttlMs}   not a replay: answer SOLD_OUT (consumed = 0 when no limit, or
                           when Redis at its maxmemory refused the count)
    {-43, ttlMs}           RATE_LIMITED: the window was used up
]]
--- @include "includes/buyerWindow"

if redis.call('EXISTS', KEYS[1]) == 1 then return {2} end
local requests = tonumber(ARGV[1])
if requests == 0 then return {1, 0, 0} end
local consumed, ttl = countWindow(2, tonumber(ARGV[2]))
if consumed > requests then return {-43, ttl} end
return {1, consumed, ttl}

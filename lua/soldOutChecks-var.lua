--[[
  The sold-out answer's one call (runtime/api/orders-routes.ts, after this process saw the SKU
  sold out), for every such submission of one turn of the api's event loop in one scope
  (core/sold-out-checks.ts): whether each is a replay, and otherwise its point in the buyer's
  rate-limit window. Per submission in the same order as reserve-9.lua: a replay first, free (it
  is answered with its reservation, like a poll); then the window, so a bot hammering a sold-out
  SKU spends its window as it would on the script and cannot keep its budget for a restock.
  Submissions are checked in their order in KEYS: two of one buyer count two points, as two calls
  would.

  Input, per submission i = 1..(#KEYS-1)/2 (all keys in one slot):
    KEYS[2i-1] reservation hash    (a reservation or a cancel marker under the derived id)
    KEYS[2i]   the buyer's counter (core/keys.ts rateLimitKey('buyer', <buyer>); ignored when
                                    ARGV[2i-1] is 0)
    ARGV[2i-1] requests per window (0: no per-buyer limit)
    ARGV[2i]   window seconds
  and last, once:
    KEYS[#KEYS] the scope's meta hash: when it is gone, or a cleanup has begun ('cleanupBegan',
                core/activity-cache.ts cleanupActivity), a reservation may be deleted already and
                the cache cannot tell a retry from a new submission: every submission is answered
                2, and reserve-9.lua answers it NOT_LOADED, so the api asks PostgreSQL (a retry of
                a submission that reserved gets its order back, not SOLD_OUT)

  Output: {0, then three numbers per submission}:
    2, 0, 0                a reservation or marker exists, or the cache is going (above): the
                           caller goes on to reserve-9.lua, which replays it (no point counted
                           here nor there) or, for a marker, an id reserved for another SKU or
                           quantity, or a cache that is going, counts the point there and
                           refuses or answers NOT_LOADED
    1, consumed, ttlMs     not a replay: answer SOLD_OUT (consumed = 0 when no limit, or when
                           Redis at its maxmemory refused the count)
    -43, consumed, ttlMs   RATE_LIMITED: the window was used up
    'ERR', message, 0      this submission's count failed (Redis refusing writes: MISCONF,
                           NOREPLICAS, READONLY): for it alone, as its own call would have; the
                           others of the call are answered (a replay writes nothing)
]]
--- @include "includes/buyerWindow"

local out = {0}
local function answer(code, consumed, ttl)
  out[#out + 1] = code
  out[#out + 1] = consumed
  out[#out + 1] = ttl
end

local scope = redis.call('HMGET', KEYS[#KEYS], 'gate', 'cleanupBegan')
local going = not scope[1] or scope[2]
for i = 1, (#KEYS - 1) / 2 do
  if going or redis.call('EXISTS', KEYS[2 * i - 1]) == 1 then
    answer(2, 0, 0)
  else
    local requests = tonumber(ARGV[2 * i - 1])
    if requests == 0 then
      answer(1, 0, 0)
    else
      local ok, consumed, ttl = pcall(countWindow, 2 * i, tonumber(ARGV[2 * i]))
      if not ok then
        answer('ERR', type(consumed) == 'table' and consumed.err or tostring(consumed), 0)
      elseif consumed > requests then
        answer(-43, consumed, ttl)
      else
        answer(1, consumed, ttl)
      end
    end
  end
end
return out

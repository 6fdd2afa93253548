-- The per-buyer rate limit's fixed window (docs/operator.md "Traffic shaping and eligibility"),
-- counted exactly as the api's RateLimiterRedis counts it (lua/limiterWindow-1.lua, runtime/api/rate-limit.ts), so
-- the api's other limited routes, which still use that library, share this counter and window:
-- an integer string that lives `seconds` from its first point, one point per submission, kept
-- counting past the limit. `k` is the counter's index in KEYS; `points` (1 unless given) is what
-- this call counts, negative to give points back (lua/limiterWindow-1.lua). Returns the points of this window
-- (this one included) and the milliseconds until the window ends; 0, 0, true when nothing was
-- counted because Redis is at its maxmemory (noeviction: OOM). Then no script can write anything, so no
-- reservation is made and the window guards nothing, but the answers that write nothing (a
-- replay, sold out, the gate's, the eligibility's, limit reached) are still given instead of the
-- refusal, so a buyer of a sold-out SKU hears SOLD_OUT rather than a 503 to retry. The refusal is
-- the script's first write, so nothing is written before it and the script goes on.
--- @include "includes/writeUnlessFull"
local function countWindow(k, seconds, points)
  local _, full = writeUnlessFull('SET', KEYS[k], 0, 'EX', seconds, 'NX')
  if full then return 0, 0, true end
  local consumed = redis.call('INCRBY', KEYS[k], points or 1)
  local ttl = redis.call('PTTL', KEYS[k])
  -- Never longer than the window asked for now: a window shortened mid-sale (spec.trafficShaping
  -- edited) applies to a buyer counting in a longer one too, not only after it ends.
  if ttl == -1 or ttl > 1000 * seconds then
    redis.call('PEXPIRE', KEYS[k], 1000 * seconds)
    ttl = 1000 * seconds
  end
  return consumed, ttl
end

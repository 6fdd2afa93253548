-- The per-buyer rate limit's fixed window (docs/operator.md "Traffic shaping and eligibility"),
-- counted exactly as rate-limiter-flexible's RateLimiterRedis counts it (its incr/ttl script), so
-- the api's other limited routes, which still use that library, share this counter and window:
-- an integer string that lives `seconds` from its first point, one point per submission, kept
-- counting past the limit. `k` is the counter's index in KEYS. Returns the points of this window
-- (this one included) and the milliseconds until the window ends.
local function countWindow(k, seconds)
  redis.call('SET', KEYS[k], 0, 'EX', seconds, 'NX')
  local consumed = redis.call('INCRBY', KEYS[k], 1)
  local ttl = redis.call('PTTL', KEYS[k])
  if ttl == -1 then
    redis.call('EXPIRE', KEYS[k], seconds)
    ttl = 1000 * seconds
  end
  return consumed, ttl
end

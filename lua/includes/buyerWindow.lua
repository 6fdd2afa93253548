-- The per-buyer rate limit's fixed window (docs/operator.md "Traffic shaping and eligibility"),
-- counted exactly as rate-limiter-flexible's RateLimiterRedis counts it (its incr/ttl script), so
-- the api's other limited routes, which still use that library, share this counter and window:
-- an integer string that lives `seconds` from its first point, one point per submission, kept
-- counting past the limit. Returns the points of this window (this one included) and the
-- milliseconds until the window ends.
local function countWindow(key, seconds)
  redis.call('SET', key, 0, 'EX', seconds, 'NX')
  local consumed = redis.call('INCRBY', key, 1)
  local ttl = redis.call('PTTL', key)
  if ttl == -1 then
    redis.call('EXPIRE', key, seconds)
    ttl = 1000 * seconds
  end
  return consumed, ttl
end

--[[
  Records a buyer's cancellation of a submission that has not reached the cache yet (its 202 was
  lost), so the late submission is refused with CANCELLED (reserve-9.lua). The reservation id is
  derived by the caller from (activity, buyer, requestId): a buyer can only ever mark ids of their
  own submissions, and a marker can never stand in the way of another buyer's submission.

  A marker is bounded twice so that buyers cannot grow Redis (noeviction) with them:
  - it expires at the sale's end (meta endMs, judged by this server's clock) plus ARGV[3] seconds:
    no submission can reserve after endMs, the margin covers an endAt extended later;
  - each buyer may leave at most ARGV[4] markers per activity (counted in the buyer hash).
  Nothing is written when the sale has ended already: nothing can arrive any more.

  Input:
    KEYS[1] meta hash
    KEYS[2] reservation hash  (the marker's key: the reservation the submission would create)
    KEYS[3] buyer hash        (field `cancelMarkers`: markers this buyer left)

    ARGV[1] buyer id
    ARGV[2] reason            (CANCELLED)
    ARGV[3] seconds the marker outlives the sale's end (integer >= 1)
    ARGV[4] most markers per buyer and activity (integer >= 0)

  Output:
     {1, ttlSeconds}          marker recorded
     {2, state}               a reservation or marker of this buyer exists already (nothing changed)
     {3}                      the sale has ended or is not loaded: nothing can arrive, nothing written
    -11 FROZEN                stock was written back
    -14 MISMATCH              a reservation of another buyer exists under this id
    -19 CANCEL_MARKER_LIMIT   this buyer left the most markers allowed; the reply's next element is
                              the ms until the sale's end, when no submission can reserve any more
]]
local user = ARGV[1]
local grace, maxMarkers = tonumber(ARGV[3]), tonumber(ARGV[4])

--- @include "includes/nowMs"

local meta = redis.call('HMGET', KEYS[1], 'gate', 'endMs')
if meta[1] == 'frozen' then return {-11} end

local r = redis.call('HMGET', KEYS[2], 'state', 'user')
if r[1] then
  if r[2] ~= user then return {-14} end
  return {2, r[1]}
end

local now = nowMs()
local endMs = tonumber(meta[2])
if not meta[1] or meta[1] == 'closed' or not endMs or now >= endMs then return {3} end

local markers = tonumber(redis.call('HGET', KEYS[3], 'cancelMarkers') or '0')
if markers >= maxMarkers then return {-19, endMs - now} end

local ttl = math.ceil((endMs - now) / 1000) + grace
redis.call('HSET', KEYS[2], 'state', 'CANCELLED', 'user', user, 'releasedAt', now, 'reason', ARGV[2])
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('HINCRBY', KEYS[3], 'cancelMarkers', 1)
return {1, ttl}

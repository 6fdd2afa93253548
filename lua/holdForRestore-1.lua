--[[
  First step of a cache restore (core/cache-restore.ts): keeps buyers out while the operator
  rebuilds the cache from PostgreSQL. A cache that came back empty gets a meta hash holding only
  the gate `paused`, the sale window and the owner, so every submission is refused with PAUSED
  (never NOT_LOADED, which would send a replay to PostgreSQL while the cache is half rebuilt). A
  cache that came back behind has its gate moved to `paused` unless it is already closed, and its
  sale window set to the one of the generation the operator loaded (a snapshot taken before an
  endAt extension was loaded holds the old endAt; the reload then marks that generation).
  Idempotent: a repeat changes nothing more.

  Input:
    KEYS[1] meta hash
    ARGV[1] restore epoch (integer >= 1), recorded as `restoring`
    ARGV[2] startMs of the generation loaded
    ARGV[3] endMs of the generation loaded
    ARGV[4] requireCode '1' | '0'
    ARGV[5] reopen on release '1' | '0'
    ARGV[6] owner uid

  Output:
     {1, previousGate}   previousGate is '' when the cache was empty
    -11 FROZEN           the gate is frozen: stock was written back, nothing to restore
    -16 BAD_ARGUMENT     malformed epoch
]]
local epoch = tonumber(ARGV[1])
if not epoch or epoch < 1 then return {-16} end
local gate = redis.call('HGET', KEYS[1], 'gate')
if gate == 'frozen' then return {-11} end
if not gate then
  redis.call('HSET', KEYS[1], 'gate', 'paused', 'startMs', ARGV[2], 'endMs', ARGV[3],
    'requireCode', ARGV[4], 'reopen', ARGV[5], 'owner', ARGV[6], 'restoring', epoch)
  return {1, ''}
end
if gate == 'open' or gate == 'pending' then redis.call('HSET', KEYS[1], 'gate', 'paused') end
redis.call('HSET', KEYS[1], 'startMs', ARGV[2], 'endMs', ARGV[3], 'restoring', epoch)
return {1, gate}

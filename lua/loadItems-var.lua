--[[
  Cache loading, fenced per SKU by the activity generation so that a repeat (an operator that
  crashed and runs again) never resets live stock. Called in chunks; the last chunk marks the
  whole generation loaded. Stock only grows between generations (added stock is applied as the
  difference to the previous initial stock); a decrease is refused before anything is written.

  Input (numkeys given by the caller: 3 + number of SKUs in this chunk):
    KEYS[1]      meta hash
    KEYS[2]      counters hash
    KEYS[3]      sku index set (every sku id of the activity)
    KEYS[4..n]   one sku hash per SKU, in the order of the ARGV groups

    ARGV[1] generation (integer)
    ARGV[2] startMs
    ARGV[3] endMs
    ARGV[4] requireCode '1' | '0'
    ARGV[5] reopen on release '1' | '0'
    ARGV[6] '1' when this is the last chunk, else '0'
    ARGV[7 + 5*(i-1) ..] per SKU i: sku id, initial stock, limit per user, unit price, name

  Output:
     {1, created, topped, skipped, stockAdded}
    -16 BAD_ARGUMENT   malformed group (generation, stock or limit not a plain non-negative integer)
    -17 STOCK_DECREASE a SKU's initial stock would go down (second element: the sku id)
    -18 STALE_GENERATION an older generation than the one already loaded
]]
local find = string.find
if not find(ARGV[1], '^%d+$') then return {-16} end
local gen = tonumber(ARGV[1])
local loadedGen = tonumber(redis.call('HGET', KEYS[1], 'gen') or '0')
if gen < loadedGen then return {-18} end

local n = #KEYS - 3
if #ARGV ~= 6 + 5 * n then return {-16} end

-- Check every SKU of the chunk before writing any. One EXISTS over the chunk's SKU hashes tells a
-- first load (none exists: nothing to compare, nothing to fence) from a repeat or a top-up, which
-- reads each hash; the first load is the warm-up's common case and skips 2,000 reads per chunk.
local anyExists = n > 0 and redis.call('EXISTS', unpack(KEYS, 4)) > 0
local current = {}
for i = 1, n do
  local base = 6 + 5 * (i - 1)
  -- Stock and limit are stored as the caller sent them, so both must be plain non-negative
  -- integers: a pattern test is stricter than tonumber ('1e3', '0x10', '1.5' are refused) and, with
  -- the text written as is, spares the number parsing and printing of 100,000 SKUs per warm-up.
  if not find(ARGV[base + 2], '^%d+$') or not find(ARGV[base + 3], '^%d+$') then return {-16} end
  if anyExists then
    local cur = redis.call('HMGET', KEYS[3 + i], 'initial', 'gen')
    local initial = tonumber(ARGV[base + 2])
    if cur[1] and tonumber(cur[2]) < gen and initial < tonumber(cur[1]) then return {-17, ARGV[base + 1]} end
    current[i] = cur
  end
end

local created, topped, skipped, added = 0, 0, 0, 0
local newIds = {}
for i = 1, n do
  local key = KEYS[3 + i]
  local base = 6 + 5 * (i - 1)
  local initialText = ARGV[base + 2]
  local cur = current[i]
  if not cur or not cur[1] then
    redis.call('HSET', key, 'stock', initialText, 'initial', initialText, 'limit', ARGV[base + 3],
      'price', ARGV[base + 4], 'name', ARGV[base + 5], 'gen', ARGV[1])
    newIds[#newIds + 1] = ARGV[base + 1]
    created = created + 1
    added = added + tonumber(initialText)
  elseif tonumber(cur[2]) < gen then
    local delta = tonumber(initialText) - tonumber(cur[1])
    redis.call('HINCRBY', key, 'stock', delta)
    redis.call('HSET', key, 'initial', initialText, 'limit', ARGV[base + 3], 'price', ARGV[base + 4],
      'name', ARGV[base + 5], 'gen', gen)
    topped = topped + 1
    added = added + delta
  else
    skipped = skipped + 1
  end
end
-- One SADD per chunk (callers keep chunks well below Lua's unpack limit of about 8,000).
if #newIds > 0 then redis.call('SADD', KEYS[3], unpack(newIds)) end
if added > 0 then redis.call('HINCRBY', KEYS[2], 'initial', added) end

redis.call('HSETNX', KEYS[1], 'gate', 'pending')
redis.call('HSET', KEYS[1], 'startMs', ARGV[2], 'endMs', ARGV[3], 'requireCode', ARGV[4],
  'reopen', ARGV[5])
if ARGV[6] == '1' and gen > loadedGen then
  redis.call('HSET', KEYS[1], 'gen', gen)
  redis.call('HINCRBY', KEYS[1], 'loads', 1)
end
return {1, created, topped, skipped, added}

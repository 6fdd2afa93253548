-- Milliseconds from the Redis server clock, so every api replica judges the sale window alike.
local function nowMs()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

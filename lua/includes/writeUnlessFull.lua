-- Runs one write command with redis.pcall and returns its reply; or nil and Redis's refusal when
-- Redis is at its maxmemory (noeviction: OOM). Redis refuses a script only at its first write and
-- lets it go on after one, so a refusal here means nothing was written before it: the script can
-- still give the answers that write nothing (ARCHITECTURE.md "One Redis call per submission").
-- Any other error is raised as redis.call would raise it.
local function writeUnlessFull(...)
  local reply = redis.pcall(...)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 4) == 'OOM ' then return nil, reply.err end
    error(reply)
  end
  return reply
end

--[[
  Counts one submission in the buyer's rate-limit window, alone: for a submission whose other
  keys are not in the activity's slot (a SKU split into stock buckets, ARCHITECTURE.md "Stock
  buckets"), where reserve-9.lua and soldOutChecks-var.lua cannot hold the counter.

  Input:
    KEYS[1] the buyer's counter (core/keys.ts rateLimitKey('buyer', <buyer>))
    ARGV[1] requests per window (>= 1)
    ARGV[2] window seconds (>= 1)

  Output:
    {1, consumed, ttlMs}   counted; consumed = points of this window, this one included;
                           {1, 0, 0}: not counted, Redis is at its maxmemory
    {-43, ttlMs}           RATE_LIMITED: the window was used up (this point counted all the same)
]]
--- @include "includes/buyerWindow"

local consumed, ttl = countWindow(1, tonumber(ARGV[2]))
if consumed > tonumber(ARGV[1]) then return {-43, ttl} end
return {1, consumed, ttl}

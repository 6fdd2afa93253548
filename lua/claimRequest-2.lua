--[[
  Claims a submission's reservation id in the activity's own scope before it is reserved in a
  stock bucket (core/reservations.ts reserve(); ARCHITECTURE.md "Stock buckets"), and counts it in
  the buyer's window there in the same call. A buyer's scopes are the activity's and one bucket per
  bucketed SKU, each in its own slot: without the claim a requestId used for a bucketed SKU and then
  for another SKU (or the other way round) would reserve twice under one id, and PostgreSQL, where
  the id is unique, would keep one order for two 202s. The claim is a hash under the reservation's
  key of the activity's scope, state ELSEWHERE, so reserve-9.lua (an ordinary SKU under this id)
  refuses it as IDEMPOTENCY_CONFLICT as it refuses any reservation of another SKU; readers of
  reservations skip it (core/order-message.ts reservationRecordOf).

  Every claim attempt counts in `attempts`; a refused reservation takes its attempt back
  (unclaimRequest-1.lua) and the claim goes only when no attempt is left under it, so an attempt
  that reserved keeps it whatever the attempts beside it (a retry racing it) do.

  Input:
    KEYS[1] reservation hash of the activity's scope, under the submission's reservation id
    KEYS[2] the buyer's counter (core/keys.ts rateLimitKey('buyer', <buyer>); ignored when
            ARGV[4] is 0)
    ARGV[1] buyer id
    ARGV[2] sku id
    ARGV[3] quantity
    ARGV[4] requests per window (0: not counted here)
    ARGV[5] window seconds

  Output:
    {1, consumed, ttlMs, attempts}  claimed (consumed = 0 when not counted); attempts: the claim's
                                    attempts not refused yet, this one included
    {2, consumed, ttlMs}            this buyer's cancel marker holds the id: nothing claimed; the
                                    caller's reservation in the bucket replays an earlier one or
                                    answers CANCELLED (reserve-9.lua ARGV[11] '1'), whether or not
                                    the cancellation reached the bucket too
    {3, consumed, ttlMs, refusal}   Redis is at its maxmemory and refused the claim (refusal: its
                                    OOM error): nothing claimed or counted; the caller's bucket
                                    gives only the answers that write nothing (reserve-9.lua
                                    ARGV[11] '2') and a reservation is refused with this error
    -10 IDEMPOTENCY_CONFLICT        the id holds a reservation or claim of another SKU or quantity
    {-43, ttlMs}                    RATE_LIMITED: the window was used up
]]
--- @include "includes/writeUnlessFull"
--- @include "includes/buyerWindow"

local user, sku, qty = ARGV[1], ARGV[2], ARGV[3]
local prior = redis.call('HMGET', KEYS[1], 'state', 'sku', 'qty', 'user')
local cancelled = prior[1] == 'CANCELLED' and prior[4] == user
if prior[1] and prior[4] == user and not cancelled and (prior[2] ~= sku or prior[3] ~= qty) then
  return {-10}
end

local consumed, ttl = 0, 0
local requests = tonumber(ARGV[4])
if requests > 0 then
  consumed, ttl = countWindow(2, tonumber(ARGV[5]))
  if consumed > requests then return {-43, ttl} end
end

if cancelled then return {2, consumed, ttl} end
-- Ids are derived from the buyer: another buyer's hash here can only be a stale cancel marker.
if prior[1] and prior[4] ~= user then redis.call('DEL', KEYS[1]) end
local attempts, full
if prior[1] == 'ELSEWHERE' and prior[4] == user then
  attempts, full = writeUnlessFull('HINCRBY', KEYS[1], 'attempts', 1)
else
  local _
  _, full = writeUnlessFull('HSET', KEYS[1], 'state', 'ELSEWHERE', 'sku', sku, 'qty', qty, 'user', user,
    'attempts', 1)
  attempts = 1
end
-- Refused only as the script's first write: the window's count was refused too (consumed 0).
if full then return {3, consumed, ttl, full} end
return {1, consumed, ttl, attempts}

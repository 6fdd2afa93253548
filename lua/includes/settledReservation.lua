-- The reservation that a release or a late payment settles (KEYS[1] meta hash, KEYS[2]
-- reservation hash; ARGV[1..3] reservation id, buyer, sku): once the stock was written back
-- (gate frozen) Redis stock never changes again, so both refuse with FROZEN and settle through
-- PostgreSQL instead (docs/after-sale.md); an id with no reservation is UNKNOWN_RESERVATION.
-- Leaves rid, user, sku, nowMs(), r (state, user, sku, qty, slot) and state.
local rid, user, sku = ARGV[1], ARGV[2], ARGV[3]

--- @include "includes/nowMs"

if redis.call('HGET', KEYS[1], 'gate') == 'frozen' then return {-11} end

local r = redis.call('HMGET', KEYS[2], 'state', 'user', 'sku', 'qty', 'slot')
local state = r[1]
if not state then return {-12} end

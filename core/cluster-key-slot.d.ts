// The package ships no types: its one export maps a key to its Redis Cluster slot (0..16383),
// honouring hash tags (the same function ioredis routes with).
declare module 'cluster-key-slot' {
  export default function calculateSlot(key: string | Buffer): number;
}

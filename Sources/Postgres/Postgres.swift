// Placeholder for the Postgres module.
import CLibPQ

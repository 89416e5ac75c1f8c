"""The memo of answers: a bounded LRU map input -> label, persisted in a database, and the ledger.

Why it exists: a noised label is a random draw. If an attacker could ask the same question
twice and get fresh draws, averaging them would reveal N's label and void the iDP guarantee.
So the first draw for an input is stored and every later query for that input gets the same
answer - also after a restart or a crash (hence a database, not a dict).

Released answers (N's own label) are stored too, with `noised = 0`: the classifier gives both
branches the same memo read and write, so neither the time of an answer nor whether it is a
memo hit depends on the branch (see lucid/access/classifier.py).

The privacy ledger (lucid/access/ledger.py) lives in the same database and is updated in the same
transaction as the answers it accounts for, so a crash or a concurrent writer can neither lose
nor double-count an entry. Its statements are all in budget.py.

One epsilon per memo: every stored draw was made with the epsilon the memo records, and a memo
refuses to answer or charge with another one (metadata.py), so a client is always charged the
epsilon its answers were drawn with.

Bounded: LRU eviction (the paper's policy) once more than `max_size` inputs are stored; an
evicted input can be re-sampled, which is the price of bounded storage.

The modules, each importing only those listed before it (tests/project/test_layering.py checks that no
import runs back):

    addresses.py  what `--memo` names (a file or a postgresql:// URL) and how messages name it
    backend.py    what a database supplies to hold a memo (connections, transactions, locks, errors)
    request.py    what one call asks: its keys and proposals, and the `Charge` (client, budgets)
    budget.py     the ledger's SQL: charges, refusals, the budget decisions, the reservations of
                  calls answered in turns, and the rows `lucid budget` reads
    metadata.py   what a memo is bound to (N, epsilon, bounds) and the migration of older files
    turns.py      a large call answered a few hundred inputs at a time; the gate ordering the turns
    store.py      the algorithm itself (`SqlMemo`) and what the classifier needs of it (`MemoStore`)
    sqlite.py     the memo in one SQLite file (`SqliteMemo`, alias `Memo`): the embedded default
    postgres.py   the memo in a PostgreSQL database several replicas share (`PostgresMemo`)
    opening.py    `open_memo`: the backend `--memo` names; `read_memo_ledger` for `lucid budget`

postgres.py is imported only when used (it needs psycopg), so it is not exported here.
"""

from lucid.access.memo.addresses import MEMO_FILE, display_name, is_database_url, memo_name, memo_target, redact_secrets
from lucid.access.memo.backend import MemoError, MemoUnavailable
from lucid.access.memo.metadata import BoundsRecord
from lucid.access.memo.opening import open_memo, read_memo_ledger
from lucid.access.memo.request import Charge
from lucid.access.memo.sqlite import SqliteMemo
from lucid.access.memo.store import DEFAULT_MEMO_SIZE, MemoStore, SqlMemo
from lucid.access.memo.turns import SizeOrderedGate, Turn

Memo = SqliteMemo  # the embedded default (and the name the package has always exported)

__all__ = [
    "DEFAULT_MEMO_SIZE",
    "MEMO_FILE",
    "BoundsRecord",
    "Charge",
    "Memo",
    "MemoError",
    "MemoStore",
    "MemoUnavailable",
    "SizeOrderedGate",
    "SqlMemo",
    "SqliteMemo",
    "Turn",
    "display_name",
    "is_database_url",
    "memo_name",
    "memo_target",
    "open_memo",
    "read_memo_ledger",
    "redact_secrets",
]

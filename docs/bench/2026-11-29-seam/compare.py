import csv,math,os,statistics as st
d=os.path.dirname(os.path.abspath(__file__))
# Medians of two runs per side of scripts/bench.sh --quick, BENCH_MODES="packet tap-q".
def load(path):
    rows={}
    for r in csv.DictReader(open(path)):
        k=(r['what'],r['mode'],r['bytes'],r['qps'])
        try: rows[k]=float(r['value'])
        except: pass
    return rows
B=[load(f'{d}/before-{k}.csv') for k in (1,2)]
A=[load(f'{d}/after-{k}.csv') for k in (1,2)]
keys=[k for k in B[0] if all(k in x for x in B+A)]
bymode={}
for k in keys:
    b=st.median([x[k] for x in B]); a=st.median([x[k] for x in A])
    lat='lat' in k[0]
    r=(b/a) if lat else (a/b)   # >1: after better
    bymode.setdefault(k[1],[]).append(r)
    print(f"{k[0]:12} {k[1]:7} {k[2]:>8} q{k[3]:>3}  before {b:10.2f}  after {a:10.2f}  ratio {r:5.2f}")
for m,v in bymode.items():
    print(m, 'rows', len(v), 'geomean after/before (higher better)', round(math.exp(sum(map(math.log,v))/len(v)),3), 'min', round(min(v),2), 'max', round(max(v),2))

# atlas WAN profile: measured round-trip times between nine AWS regions. Format: profiles/README.md
format   = atlas-profile 1
kind     = wan
name     = aws-2017
date     = "2017-04 (publication of the reproduced table)"
regions  = us-east-1 us-west-1 us-west-2 eu-west-1 eu-central-1 ap-northeast-1 ap-northeast-2 ap-southeast-1 ap-southeast-2
# Average ping RTT in ms, row = from, column = to (rows are not exactly symmetric: as measured).
rtt_ms   = 0 72.74 86.98 80.55 88.66 145.3 178.4 216.7 230   71.63 0 19.46 153.2 166.6 102.5 131.5 174 157.5   88.68 19.2 0 137 159.5 89.1 118.3 161.4 162.2   80.52 153.2 137 0 19.56 212.4 242.4 239 309.6   88.62 166.6 159.5 19.55 0 236.5 266.2 325.9 323.5   145.3 102.5 89.16 212.4 236.6 0 31.44 73.79 103.9   176.6 132.6 118.2 242.4 265.3 31.32 0 71.87 134   216.7 173.9 161.4 238.1 325.9 73.81 71.29 0 175.3   229.7 157.8 161.9 309.6 323.2 103.9 134 175.4 0
# Capacity between every pair of regions, Gbit/s (one value = every pair). An assumption, not a
# measurement: clouds do not publish inter-region capacity.
bandwidth_gbps = 100
source.rtt_ms = "average ping latency (round trip) between EC2 instances, table 'Latency Between AWS Global Regions' as reproduced in acomputerscientistlearnsaws.blogspot.com/2017/04/aws-regions.html (April 2017); the sa-east-1 row was cut off there and is left out"
source.bandwidth_gbps = "assumption: 100 Gbit/s, the largest common dedicated port of AWS Direct Connect (1/10/100 Gbit/s ports); change it for your contract"

<#
.SYNOPSIS
  Checks the Ephemera scratch driver on a real Windows node: dir and vhdx
  volumes published, used and unpublished the way the kubelet does it.

.DESCRIPTION
  Run on a Windows Server 2022 (or later) node, in an elevated PowerShell
  (Administrator or SYSTEM: symlinks, virtual disks, partitioning and folder
  mount points need it), from a folder holding the outputs of `make
  build-windows` (_output/bin/windows):

      ephemera-scratch.exe   the driver
      ephemera-wintest.exe   the kubelet simulator (test/windows/client)
      run.ps1                this script

  The script starts the driver with a throw-away state directory and a fake
  kubelet root (no kubelet or cluster is involved and the real
  C:\var\lib\kubelet is never touched), runs the client against its unix
  socket, then checks that nothing is left: no link, no VHDX file, no virtual
  disk attached, no mount folder. It prints a PASS/FAIL table and exits 1 if
  any check failed (2 if it could not run).

  -Mode csi-proxy checks the other Windows model (--windows-mode=csi-proxy):
  the driver changes the host only through csi-proxy v1, which must run on
  the node as a service (its pipe \\.\pipe\csi-proxy-filesystem-v1 present),
  and serves the dir backend only. csi-proxy accepts paths below its
  --kubelet-path only, so the throw-away kubelet root is then a new
  subdirectory of that path (-CsiProxyKubeletPath, default
  C:\var\lib\kubelet), removed at the end; the kubelet ignores it. The driver
  still runs as a process of this session, not in a container: the check is
  of the requests csi-proxy gets and what they do on the node, not of the
  container's isolation.

  Neither mode has been run on a real Windows node by the project yet.

.EXAMPLE
  .\run.ps1
  .\run.ps1 -VhdxSize 256Mi -Keep
  .\run.ps1 -Mode csi-proxy
#>
[CmdletBinding()]
param(
    # Folder with ephemera-scratch.exe and ephemera-wintest.exe.
    [string]$BinDir = $PSScriptRoot,
    # Size of the vhdx test volume (Mi or Gi).
    [string]$VhdxSize = "128Mi",
    # Test the dir backend only.
    [switch]$SkipVhdx,
    # Keep the work directory and the driver log.
    [switch]$Keep,
    # The Windows model: hostprocess (the driver links itself) or csi-proxy
    # (every change through csi-proxy v1; dir backend only).
    [ValidateSet("hostprocess", "csi-proxy")]
    [string]$Mode = "hostprocess",
    # csi-proxy's --kubelet-path (-Mode csi-proxy).
    [string]$CsiProxyKubeletPath = "C:\var\lib\kubelet"
)

$ErrorActionPreference = "Stop"
Set-StrictMode -Version Latest

$results = New-Object System.Collections.Generic.List[object]
function Add-Result([string]$Check, [bool]$Ok, [string]$Detail = "") {
    $results.Add([pscustomobject]@{ Result = $(if ($Ok) { "PASS" } else { "FAIL" }); Check = $Check; Detail = $Detail })
}

$driver = Join-Path $BinDir "ephemera-scratch.exe"
$client = Join-Path $BinDir "ephemera-wintest.exe"
foreach ($exe in $driver, $client) {
    if (-not (Test-Path $exe)) { Write-Error "missing $exe (run make build-windows and copy _output/bin/windows)"; exit 2 }
}
$principal = New-Object Security.Principal.WindowsPrincipal([Security.Principal.WindowsIdentity]::GetCurrent())
if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) {
    Write-Error "run elevated (Administrator or SYSTEM): symlinks and virtual disks need it"; exit 2
}

# Short paths: the unix socket path is limited to 108 bytes.
$id = [guid]::NewGuid().ToString("N").Substring(0, 8)
$work = Join-Path $env:SystemDrive ("eph-" + $id)
$kubelet = Join-Path $work "kubelet"
$driverName = "scratch.csi.ephemera.dev"
$dirRoot = Join-Path $work "state\volumes"
if ($Mode -eq "csi-proxy") {
    $SkipVhdx = $true
    if (-not (Test-Path "\\.\pipe\csi-proxy-filesystem-v1")) {
        Write-Error "csi-proxy's pipe \\.\pipe\csi-proxy-filesystem-v1 is missing: install and start csi-proxy v1 (docs/operations.md, `"csi-proxy versions`")"; exit 2
    }
    $kubelet = Join-Path $CsiProxyKubeletPath ("eph-test-" + $id)
    $dirRoot = Join-Path $kubelet "plugins\$driverName\volumes"
}
$state = Join-Path $work "state"
$sock = Join-Path $work "csi.sock"
$endpoint = "unix://$sock"
$log = Join-Path $work "driver.log"
New-Item -ItemType Directory -Force -Path (Join-Path $kubelet "pods"), $state | Out-Null

# Virtual disks before the run, to tell ours from the node's.
function Get-VhdDisks { @(Get-Disk | Where-Object { $_.Location -like "$state*" }) }

$backends = if ($SkipVhdx) { "dir" } else { "dir,vhdx" }
$driverArgs = @("--driver-name=$driverName", "--endpoint=$endpoint", "--nodeid=$env:COMPUTERNAME",
          "--kubelet-root=$kubelet", "--state-dir=$state", "--backends=$backends", "--backend=dir",
          "--windows-mode=$Mode", "--v=4")
$proc = Start-Process -FilePath $driver -ArgumentList $driverArgs -PassThru -NoNewWindow `
        -RedirectStandardError $log -RedirectStandardOutput (Join-Path $work "driver.out")

try {
    $deadline = (Get-Date).AddSeconds(30)
    while (-not (Test-Path $sock) -and -not $proc.HasExited -and (Get-Date) -lt $deadline) { Start-Sleep -Milliseconds 200 }
    Add-Result "driver starts and serves $endpoint" ((Test-Path $sock) -and -not $proc.HasExited) $log
    if (Test-Path $sock) {
        $clientArgs = @("--endpoint=$endpoint", "--kubelet-root=$kubelet", "--state-dir=$state", "--dir-root=$dirRoot", "--vhdx-size=$VhdxSize")
        if ($SkipVhdx) { $clientArgs += "--skip-vhdx" }
        # Windows PowerShell turns a native program's stderr into errors under
        # "Stop": relax it for this call.
        $ErrorActionPreference = "Continue"
        $out = & $client @clientArgs 2>&1
        $clientExit = $LASTEXITCODE
        $ErrorActionPreference = "Stop"
        foreach ($line in $out) {
            $f = "$line" -split "`t", 4
            if ($f.Count -ge 3 -and $f[0] -eq "RESULT") { Add-Result $f[1] ($f[2] -eq "PASS") $(if ($f.Count -ge 4) { $f[3] } else { "" }) }
            else { Write-Verbose "client: $line" }
        }
        # 0: all passed, 1: some failed (listed above), anything else: it could not run.
        Add-Result "client ran to the end" ($clientExit -eq 0 -or $clientExit -eq 1) "exit $clientExit"
    }
    # Independent of the client: nothing of ours left on the node.
    Add-Result "no virtual disk of the test attached" ((Get-VhdDisks).Count -eq 0) ((Get-VhdDisks | ForEach-Object { $_.Location }) -join ", ")
    $vhdxLeft = @(Get-ChildItem -Path $state -Recurse -Force -ErrorAction SilentlyContinue |
                  Where-Object { $_.Name -like "*.vhdx*" -or $_.FullName -like "*\vhdx\mnt\*" })
    Add-Result "no VHDX file or mount folder left" ($vhdxLeft.Count -eq 0) (($vhdxLeft | ForEach-Object FullName) -join ", ")
    $links = @(Get-ChildItem -Path (Join-Path $kubelet "pods") -Recurse -Force -ErrorAction SilentlyContinue |
               Where-Object { $_.Attributes -band [IO.FileAttributes]::ReparsePoint })
    Add-Result "no link left under the kubelet root" ($links.Count -eq 0) (($links | ForEach-Object FullName) -join ", ")
    $dirsLeft = @(Get-ChildItem -Path $dirRoot -Directory -Force -ErrorAction SilentlyContinue | Where-Object Name -like "csi-*")
    Add-Result "no dir volume left in $dirRoot" ($dirsLeft.Count -eq 0) (($dirsLeft | ForEach-Object FullName) -join ", ")
}
finally {
    if (-not $proc.HasExited) { Stop-Process -Id $proc.Id -Force }
    # Safety net for a failed run: detach what the test attached.
    foreach ($d in Get-VhdDisks) {
        Write-Warning "detaching leftover $($d.Location)"
        Dismount-DiskImage -ImagePath $d.Location -ErrorAction SilentlyContinue | Out-Null
    }
}

$results | Format-Table -AutoSize -Wrap Result, Check, Detail | Out-String -Width 200 | Write-Host
$failedCount = @($results | Where-Object Result -eq "FAIL").Count
if ($Keep -or $failedCount -gt 0) { Write-Host "work directory (driver log: $log): $work" }
else {
    Remove-Item -Recurse -Force $work -ErrorAction SilentlyContinue
    if ($Mode -eq "csi-proxy") { Remove-Item -Recurse -Force $kubelet -ErrorAction SilentlyContinue }
}
if ($failedCount -gt 0) { Write-Host "FAIL: $failedCount check(s) failed"; exit 1 }
Write-Host "PASS: $($results.Count) checks ($Mode)"
exit 0
